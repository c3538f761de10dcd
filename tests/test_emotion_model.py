"""The Chinese emotion model shipped beside the lexicon (no evaluation data read)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contextmode.processors.emotion import (
    OfflineEmotionScorer,
    analyze_emotion,
    analyze_lexicon,
)
from contextmode.processors.emotion_model import (
    EmotionModel,
    combine,
    emotion_features,
    load_emotion_model,
    model_intensity,
)

SHIPPED = Path(__file__).parents[1] / "src/contextmode/processors/data/emotion_zh.json"


def test_shipped_model_is_small_and_loads() -> None:
    assert SHIPPED.stat().st_size < 1_000_000
    model = load_emotion_model()
    assert model is not None
    assert model.buckets > 0 and len(model.weights) > 1000
    assert model.info and model.info["script"] == "scripts/train_emotion.py"


def test_json_round_trip_keeps_the_weights(tmp_path: Path) -> None:
    model = EmotionModel(buckets=64, weights={3: 1.5, 7: -0.25}, intercept=0.1)
    path = tmp_path / "m.json"
    path.write_text(json.dumps(model.to_json()), encoding="utf-8")
    loaded = load_emotion_model(str(path))
    assert loaded is not None
    assert loaded.intercept == 0.1
    assert loaded.weights[3] == pytest.approx(1.5, rel=1e-4)
    assert loaded.weights[7] == pytest.approx(-0.25, abs=1e-4)
    with pytest.raises(ValueError, match="not an emotion model"):
        EmotionModel.from_json({"format": "contextmode-detector/1"})


def test_features_mark_the_ends_and_the_lexicon_verdict() -> None:
    features = emotion_features("好意思吗你", analyze_lexicon("好意思吗你"))
    assert "c2:^好" in features and "c2:你$" in features
    assert any(f.startswith("lex:") for f in features)
    assert any(f.startswith("len:") for f in features)


def test_mapping_keeps_the_order_and_needs_a_sure_model_for_a_key_moment() -> None:
    assert model_intensity(0.5) == 0.25
    assert model_intensity(0.8) < 0.7 < model_intensity(0.9)
    assert combine(0.9, 0.1) == 0.9  # strong words are never pulled down
    assert combine(0.0, 0.6) < combine(0.0, 0.7)


def test_model_adds_a_signal_where_the_lexicon_sees_nothing() -> None:
    # Emotional lines without any emotion word (CPED-style) score above a plain one.
    plain = analyze_emotion("把文件发给我")
    assert plain.model_probability is not None
    for line in ("撞你个头", "你给我滚出去"):
        assert analyze_lexicon(line).intensity <= analyze_emotion(line).intensity
    assert analyze_emotion("你给我滚出去").intensity > plain.intensity


def test_english_and_lexicon_only_scoring_do_not_use_the_model() -> None:
    assert analyze_emotion("I am so sad").model_probability is None
    assert analyze_emotion("我太难过了", use_model=False) == analyze_lexicon("我太难过了")
    assert OfflineEmotionScorer(use_model=False).score_sync("把文件发给我") == 0.0


async def test_strong_chinese_feelings_stay_key_moments() -> None:
    scorer = OfflineEmotionScorer()
    for text in ("我真的崩溃了！！", "我今天特别开心！", "气死我了"):
        assert await scorer.score(text) > 0.7
