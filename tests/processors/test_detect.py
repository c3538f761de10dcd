"""Offline context-dependence detector: clear Chinese and English cases, model file."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from contextmode.processors.base import ContextDetector
from contextmode.processors.detect import (
    DetectorModel,
    OfflineContextDetector,
    context_features,
    load_detector_model,
    strong_cue,
)
from contextmode.types import Turn

ZH_HISTORY = ["什么是机器学习？", "机器学习是让计算机从数据中学习规律的方法，比如垃圾邮件过滤。"]
EN_HISTORY = ["Who wrote Hamlet?", "William Shakespeare wrote Hamlet around 1600."]


def _turns(texts: list[str]) -> list[Turn]:
    now = datetime.now(UTC)
    return [
        Turn(seq=i + 1, role="user" if i % 2 == 0 else "assistant", content=t, tokens=0,
             created_at=now)
        for i, t in enumerate(texts)
    ]


@pytest.fixture(scope="module")
def detector() -> OfflineContextDetector:
    return OfflineContextDetector()


def test_implements_the_protocol(detector: OfflineContextDetector) -> None:
    assert isinstance(detector, ContextDetector)


async def test_example_request_needs_context(detector: OfflineContextDetector) -> None:
    result = await detector.detect("举个例子", _turns(ZH_HISTORY))
    assert result.needs_context
    assert result.intent == "example"
    assert result.score >= detector.model.threshold


async def test_standalone_weather_question(detector: OfflineContextDetector) -> None:
    result = await detector.detect("北京今天天气怎么样", _turns(ZH_HISTORY))
    assert not result.needs_context
    assert result.intent is None
    assert result.score < 0.5


@pytest.mark.parametrize("message", ["继续", "它有什么缺点？", "那深度学习呢", "为什么"])
def test_chinese_follow_ups(detector: OfflineContextDetector, message: str) -> None:
    assert detector.detect_texts(message, ZH_HISTORY).needs_context


@pytest.mark.parametrize("message", ["When did he die?", "What about the second one?",
                                     "Why?", "Give me an example"])
def test_english_follow_ups(detector: OfflineContextDetector, message: str) -> None:
    assert detector.detect_texts(message, EN_HISTORY).needs_context


@pytest.mark.parametrize("message", ["What is the capital of France?",
                                     "请介绍一下Python的装饰器"])
def test_standalone_questions(detector: OfflineContextDetector, message: str) -> None:
    assert not detector.detect_texts(message, EN_HISTORY).needs_context


def test_no_history_means_nothing_to_lean_on(detector: OfflineContextDetector) -> None:
    result = detector.detect_texts("举个例子", [])
    assert not result.needs_context
    assert result.intent == "example"


def test_strong_cues() -> None:
    assert strong_cue("它多少钱") == "leading reference"
    assert strong_cue("what about the other one?") == "what-about ellipsis"
    assert strong_cue("When was she born?") == "pronoun"
    assert strong_cue("Thanks") is None
    assert strong_cue("北京今天天气怎么样") is None


def test_features_are_language_prefixed() -> None:
    zh = context_features("那个呢", ZH_HISTORY)
    en = context_features("and him?", EN_HISTORY)
    assert all(f.startswith("zh:") for f in zh) and "zh:bias" in zh
    assert all(f.startswith("en:") for f in en) and "en:pron" in en


def test_model_json_round_trip() -> None:
    model = DetectorModel(buckets=64, weights={1: 0.5, 7: -1.25, 63: 2.0}, intercept=-0.1,
                          threshold=0.4, info={"note": "tiny"})
    back = DetectorModel.from_json(model.to_json())
    assert back.buckets == 64 and back.threshold == 0.4 and back.intercept == -0.1
    assert set(back.weights) == {1, 7, 63}
    for slot, weight in model.weights.items():
        assert back.weights[slot] == pytest.approx(weight, abs=1e-3)
    assert back.probability("x", ["y"]) == pytest.approx(model.probability("x", ["y"]),
                                                          abs=1e-3)


def test_custom_model_and_threshold() -> None:
    always = DetectorModel(buckets=8, weights={}, intercept=5.0)
    never = DetectorModel(buckets=8, weights={}, intercept=-5.0)
    assert OfflineContextDetector(always).detect_texts("北京天气", ["你好"]).needs_context
    assert not OfflineContextDetector(never).detect_texts("北京天气", ["你好"]).needs_context
    lowered = OfflineContextDetector(never, threshold=0.0)
    assert lowered.detect_texts("北京天气", ["你好"]).needs_context


def test_shipped_model_is_small_and_documented() -> None:
    model = load_detector_model()
    assert 0 < len(model.weights) <= model.buckets
    assert model.info and "cross_validation" in model.info
