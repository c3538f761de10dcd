"""Offline emotion scorer: lexicon, negation, intensifiers, punctuation (zh and en)."""

from __future__ import annotations

import pytest

from contextmode.processors.base import EmotionScorer
from contextmode.processors.emotion import (
    OfflineEmotionScorer,
    analyze_emotion,
    analyze_lexicon,
    emotion_level,
)


def score(text: str) -> float:
    return analyze_emotion(text).intensity


def lexicon_score(text: str) -> float:
    return analyze_lexicon(text).intensity


def test_neutral_text_scores_zero_on_the_lexicon_and_low_with_the_model() -> None:
    assert lexicon_score("今天下午三点开会") == 0.0
    assert score("The meeting is at 3pm in room 12.") < 0.01
    # The Chinese model is never certain a plain line is neutral, but it stays calm.
    assert analyze_emotion("今天下午三点开会").intensity < 0.3


@pytest.mark.parametrize(
    ("plain", "negated"),
    [("我很难过", "我不难过"), ("我生气了", "我没有生气"), ("I am sad", "I am not sad"),
     ("I'm angry", "I'm never angry")],
)
def test_negation_lowers_emotion(plain: str, negated: str) -> None:
    assert score(negated) < score(plain)
    assert analyze_emotion(negated).hits[0].negated


def test_negated_positive_word_stays_a_feeling() -> None:
    # "不开心" is sad, not neutral: lower than 开心 but well above zero.
    assert 0.2 < score("不开心") < score("开心")


@pytest.mark.parametrize(
    ("weak", "strong"),
    [("我难过", "我太难过了"), ("有点烦", "烦死了"), ("I am sad", "I am so sad"),
     ("I'm tired", "I'm really really tired")],
)
def test_intensifiers_raise_and_diminishers_lower(weak: str, strong: str) -> None:
    assert score(strong) > score(weak)


def test_punctuation_adds_arousal() -> None:
    assert score("我好累啊!!!") > score("我好累啊")
    assert score("I'm SO angry!!") > score("I'm so angry")


def test_one_character_entries_need_a_word_boundary() -> None:
    assert lexicon_score("今天天气不错") == 0.0  # 气 inside 天气
    assert lexicon_score("我的爱好是游泳") == 0.0  # 爱 inside 爱好
    assert lexicon_score("别气了") > 0.0


def test_scores_stay_in_range_and_map_to_levels() -> None:
    for text in ["崩溃崩溃崩溃！！！😭", "", "ok", "I HATE THIS!!! I'm so so devastated..."]:
        assert 0.0 <= score(text) <= 1.0
    assert emotion_level(0.0) == 1
    assert emotion_level(0.95) == 5
    assert analyze_emotion("我真的崩溃了！！").level >= 4


async def test_scorer_implements_the_protocol() -> None:
    scorer = OfflineEmotionScorer()
    assert isinstance(scorer, EmotionScorer)
    assert await scorer.score("我今天特别开心！") > 0.7
    assert scorer.score_sync("hello") == await scorer.score("hello")


def test_a_chinese_turn_is_read_by_the_lexicon_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import contextmode.processors.emotion as emotion
    from contextmode.processors.base import PriorTurn

    calls: list[str] = []
    real = emotion.analyze_lexicon

    def counting(text: str) -> emotion.EmotionAnalysis:
        calls.append(text)
        return real(text)

    text = "我等了三个小时，航班又取消了，真的快崩溃了！！（第一次）"
    expected = analyze_emotion(text, prior=[PriorTurn(text="你好", same_speaker=False)])
    emotion._zh_scored.cache_clear()
    emotion.text_logit.cache_clear()
    monkeypatch.setattr(emotion, "analyze_lexicon", counting)
    again = analyze_emotion(text, prior=[PriorTurn(text="你好", same_speaker=False)])
    assert again == expected
    assert calls.count(text) == 1
