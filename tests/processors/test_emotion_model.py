"""The emotion model shipped beside the lexicon: text model, context stage, calibration.

No evaluation data is read; the figures on dev data are in docs/quality.md.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from contextmode.processors.base import ContextualEmotionScorer, PriorTurn
from contextmode.processors.emotion import (
    OfflineEmotionScorer,
    analyze_emotion,
    analyze_lexicon,
)
from contextmode.processors.emotion_model import (
    CALM_THRESHOLD,
    CONTEXT_FEATURES,
    KEY_MOMENT_THRESHOLD,
    Calibration,
    ContextModel,
    EmotionModel,
    PriorLogit,
    calibrate,
    context_features,
    emotion_features,
    load_emotion_model,
)

SHIPPED = Path(__file__).parents[2] / "src/contextmode/processors/data/emotion_zh.json"


def test_shipped_model_is_small_and_records_what_it_was_fitted_on() -> None:
    assert SHIPPED.stat().st_size < 1_000_000
    model = load_emotion_model()
    assert model is not None
    assert model.buckets > 0 and len(model.weights) > 1000
    assert set(model.calibration) == {"zh", "en"}
    info = model.info or {}
    assert info["script"] == "scripts/train_emotion.py"
    for entry in info["training"]:
        assert len(entry["sha256"]) == 64 and entry["dialogues"]


def test_json_round_trip_keeps_the_weights_context_and_shifts(tmp_path: Path) -> None:
    model = EmotionModel(
        buckets=64, weights={3: 1.5, 7: -0.25}, intercept=0.1,
        context=ContextModel(weights=(1.0, 0.5, 0.1, 0.0, 0.2, -0.1, 0.3, 0.05), intercept=-0.3),
        calibration={"zh": Calibration(scale=2.0, shift=0.4), "en": Calibration(shift=-0.2)},
    )
    path = tmp_path / "m.json"
    path.write_text(json.dumps(model.to_json()), encoding="utf-8")
    loaded = load_emotion_model(str(path))
    assert loaded is not None
    assert loaded.intercept == 0.1
    assert loaded.weights[3] == pytest.approx(1.5, rel=1e-4)
    assert loaded.weights[7] == pytest.approx(-0.25, abs=1e-4)
    assert loaded.context == model.context
    assert loaded.calibration == model.calibration
    assert loaded.calibration_for("fr") == Calibration()
    with pytest.raises(ValueError, match="not an emotion model"):
        EmotionModel.from_json({"format": "contextmode-detector/1"})


def test_features_mark_the_ends_and_the_lexicon_verdict() -> None:
    features = emotion_features("好意思吗你", analyze_lexicon("好意思吗你"))
    assert "c2:^好" in features and "c2:你$" in features
    assert any(f.startswith("lex:") for f in features)
    assert any(f.startswith("len:") for f in features)


def test_context_features_read_the_mood_and_the_speakers_baseline() -> None:
    assert context_features(1.5, []) == [1.5] + [0.0] * (len(CONTEXT_FEATURES) - 1)
    prior = [PriorLogit(logit=2.0, same_speaker=True), PriorLogit(logit=-1.0, same_speaker=False)]
    values = dict(zip(CONTEXT_FEATURES, context_features(0.5, prior), strict=True))
    assert values == {"own": 0.5, "prev_mean": 0.5, "has_prev": 1.0, "prev_last": -1.0,
                      "same_mean": 2.0, "has_same": 1.0, "mood": 0.5,
                      "log_turns": pytest.approx(math.log(3))}
    # The near features read the last few turns only; the mood reads further back.
    many = [PriorLogit(logit=9.0, same_speaker=False)] + [PriorLogit(logit=0.0, same_speaker=False)] * 5
    near = dict(zip(CONTEXT_FEATURES, context_features(0.0, many), strict=True))
    assert near["prev_mean"] == 0.0 and near["mood"] == pytest.approx(1.5)


def test_calibration_puts_the_labelled_shares_on_either_side() -> None:
    logits = [float(i) for i in range(-50, 50)]
    for share in (0.1, 0.39, 0.8):
        cal = calibrate(logits, share)
        assert cal.scale == 1.0
        above = sum(cal(z) > KEY_MOMENT_THRESHOLD for z in logits) / len(logits)
        assert above == pytest.approx(share, abs=0.011)
    two = calibrate(logits, 0.39, neutral_share=0.28)
    assert sum(two(z) > KEY_MOMENT_THRESHOLD for z in logits) == 39
    assert sum(two(z) < CALM_THRESHOLD for z in logits) == 28
    # A monotone map: the order is kept.
    assert two(-1.0) < two(0.0) < two(1.0)
    assert calibrate([], 0.5) == Calibration()


def test_model_adds_a_signal_where_the_lexicon_sees_nothing() -> None:
    # Emotional lines without any emotion word (CPED-style) score above a plain one.
    plain = analyze_emotion("把文件发给我")
    assert plain.model_probability is not None
    assert analyze_lexicon("你给我滚出去").intensity == 0.0
    assert analyze_emotion("你给我滚出去").intensity > plain.intensity


def test_a_quarrel_before_raises_the_same_words() -> None:
    line = "你说什么"
    calm = [PriorTurn(text="晚饭想吃什么", same_speaker=False),
            PriorTurn(text="我们明天几点出发", same_speaker=True)]
    fight = [PriorTurn(text="你给我滚出去！", same_speaker=False),
             PriorTurn(text="气死我了，你太过分了！！", same_speaker=True)]
    assert analyze_emotion(line, prior=fight).intensity > analyze_emotion(line, prior=calm).intensity


def test_english_reads_vader_and_lexicon_only_skips_every_model() -> None:
    assert analyze_emotion("I am so sad").model_probability is None
    # No lexicon word, but VADER's negative valence: distress still counts.
    assert analyze_lexicon("My life is a total mess").intensity < \
        analyze_emotion("My life is a total mess").intensity
    assert analyze_emotion("我太难过了", use_model=False) == analyze_lexicon("我太难过了")
    assert OfflineEmotionScorer(use_model=False).score_sync("把文件发给我") == 0.0


async def test_strong_feelings_are_key_moments_and_plain_lines_are_not() -> None:
    scorer = OfflineEmotionScorer()
    assert isinstance(scorer, ContextualEmotionScorer)
    for text in ("我真的崩溃了！！", "气死我了", "I'm so devastated, I can't stop crying"):
        assert await scorer.score(text) > KEY_MOMENT_THRESHOLD
    for text in ("把文件发给我", "The meeting is at 3pm in room 12."):
        assert await scorer.score(text) < KEY_MOMENT_THRESHOLD
    assert await scorer.score_in_context("你说什么", []) == await scorer.score("你说什么")


async def test_each_earlier_turn_is_read_once_as_the_context_of_the_next_scores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An earlier turn is the context of every next Chinese turn's score: its own logit is
    computed once (an English one through VADER once), and a score is the same when repeated."""
    import uuid

    from contextmode.processors import emotion

    tag = uuid.uuid4().hex[:8]  # texts no earlier test has scored
    said = [f"I lost my job today and I am scared ({tag}).", f"我真的很难过，什么都不想做。{tag}",
            f"What about rainy days ({tag})?", f"你怎么能这样对我！{tag}", f"算了，我们明天再说吧。{tag}"]
    scorer = emotion.OfflineEmotionScorer()

    def prior(n: int) -> list[PriorTurn]:
        return [PriorTurn(text=t, same_speaker=i % 2 == n % 2) for i, t in enumerate(said[:n])]

    vader = emotion._vader()
    seen: list[str] = []

    class Counting:
        def polarity_scores(self, text: str) -> dict[str, float]:
            seen.append(text)
            return vader.polarity_scores(text)

    monkeypatch.setattr(emotion, "_vader", lambda: Counting())
    scores = [await scorer.score_in_context(said[n], prior(n)) for n in range(1, len(said))]
    # The first turn is the context of three Chinese turns, the third (scored itself) of two.
    assert seen.count(said[0]) == 1 and seen.count(said[2]) == 2
    assert scores == [await scorer.score_in_context(said[n], prior(n)) for n in range(1, len(said))]
