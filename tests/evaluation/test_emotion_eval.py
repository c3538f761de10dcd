"""Emotion evaluation on tiny CPED- and ESConv-format files written here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from contextmode.evaluation import emotion as emotion_eval
from contextmode.evaluation.emotion import (
    evaluate_emotion,
    gold_turns,
    key_moments_vs_random,
    register,
)
from contextmode.evaluation.emotion_data import (
    Conversation,
    cped_dialogue_hashes,
    file_sha256,
    read_cped,
    read_esconv,
)
from contextmode.processors.emotion_model import EmotionModel

_ROWS = [
    ("1_000", "neutral", "我们明天几点出发"),
    ("1_000", "neutral", "在三号门集合"),
    ("1_000", "anger", "气死我了，你太过分了！！"),
    ("1_001", "sadness", "我真的好难过，呜呜"),
    ("1_001", "neutral", "把文件发给我"),
    ("1_001", "happy", "太好了，我好开心！"),
]


def _cped(tmp_path: Path, rows: list[tuple[str, str, str]] = _ROWS, name: str = "cped.csv") -> Path:
    path = tmp_path / name
    lines = ["TV_ID,Dialogue_ID,Utterance_ID,Speaker,Sentiment,Emotion,Utterance"]
    for i, (dialogue, emotion, text) in enumerate(rows):
        sentiment = "neutral" if emotion == "neutral" else "negative"
        lines.append(f"1,{dialogue},{dialogue}_{i},{'甲乙'[i % 2]},{sentiment},{emotion},{text}")
    path.write_text("\ufeff" + "\n".join(lines) + "\n", encoding="utf-8")
    return path


def _esconv(tmp_path: Path) -> Path:
    items = [
        (5, ["I am so devastated and hopeless!!", "I can't stop crying"]),
        (4, ["I'm really stressed about my exams", "It is hard"]),
        (2, ["Hi", "I want some advice about my schedule"]),
        (1, ["Hello", "Just checking in about work"]),
    ]
    path = tmp_path / "esconv.jsonl"
    with path.open("w", encoding="utf-8") as fh:
        for level, turns in items:
            dialog = [{"speaker": "sys", "text": "Hi, how can I help?"}]
            dialog += [{"speaker": "usr", "text": t} for t in turns]
            obj = {"survey_score": {"seeker": {"initial_emotion_intensity": str(level)}},
                   "dialog": dialog}
            fh.write(json.dumps(obj) + "\n")
    return path


def test_cped_separates_neutral_from_emotional_and_is_not_in_sample(tmp_path: Path) -> None:
    result = evaluate_emotion(_cped(tmp_path))
    assert result["dataset"] == "cped" and result["scorer"] == "shipped"
    assert result["items"] == 6
    assert result["auc"] >= 0.75
    assert result["mean_score_emotional"] > result["mean_score_neutral"]
    assert result["in_sample"] is False and result["in_sample_share"] == 0.0
    assert {"auc_length", "auc_exclaim", "auc_strong", "key_moment_share"} <= set(result)


def _model_trained_on(entries: list[dict[str, object]]) -> EmotionModel:
    return EmotionModel(buckets=8, weights={}, intercept=0.0,
                        info={"training": entries})


def test_in_sample_is_recognised_by_content_not_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trained = _cped(tmp_path, name="train.csv")
    renamed = _cped(tmp_path, name="renamed.csv")  # same bytes, another name
    part = _cped(tmp_path, _ROWS[:3], name="part.csv")  # one of the trained dialogues
    model = _model_trained_on([{"sha256": file_sha256(trained),
                                "dialogues": cped_dialogue_hashes(read_cped(trained))}])
    monkeypatch.setattr(emotion_eval, "load_emotion_model", lambda: model)
    assert emotion_eval.in_sample(renamed, [])["in_sample"] is True
    part_result = evaluate_emotion(part)
    assert part_result["in_sample"] is True and part_result["in_sample_share"] == 1.0
    other = _cped(tmp_path, [("9_000", "neutral", "完全不同的一句话")], name="other.csv")
    assert evaluate_emotion(other)["in_sample"] is False


def test_esconv_correlates_and_reports_key_moments(tmp_path: Path) -> None:
    result = evaluate_emotion(_esconv(tmp_path), first_turns=2)
    assert result["dataset"] == "esconv"
    assert result["items"] == 4
    assert result["spearman"] > 0.5
    assert {"spearman_length", "spearman_exclaim", "in_sample"} <= set(result)
    assert "ratio" in result["key_moments"]


def test_gold_turns_follow_the_situation_and_the_emotion_type() -> None:
    conv = Conversation(
        turns=(("sys", "Hi"), ("usr", "Hello"), ("usr", "I lost my job at the factory last week"),
               ("sys", "I'm sorry"), ("usr", "The anxiety keeps me awake"), ("usr", "ok")),
        level=4.0, situation="I lost my job at the factory and cannot pay rent",
        emotion_type="anxiety",
    )
    assert gold_turns(conv) == {2, 4}


async def test_key_moment_layer_beats_random_on_a_long_conversation() -> None:
    filler = [("sys", "I see, tell me more."), ("usr", "We talked about the weather today.")]
    turns = [("usr", "I am devastated, my father died and I can't stop crying!!")]
    turns += filler * 15
    conv = Conversation(turns=tuple(turns), level=5.0,
                        situation="My father died last month", emotion_type="sadness")
    result = await key_moments_vs_random([conv], draws=50)
    assert result["conversations"] == 1
    assert result["gold_hits"] == 1 and result["hit_rate"] > result["random_hit_rate"]


def test_cross_validation_runs_the_training_recipe(tmp_path: Path) -> None:
    pytest.importorskip("sklearn")
    rows = []
    for d in range(12):
        rows += [(f"2_{d:03d}", "neutral", f"明天{d}点在{d}号门集合"),
                 (f"2_{d:03d}", "anger", f"气死我了，你太过分了{d}次！！"),
                 (f"2_{d:03d}", "neutral", f"把第{d}份文件发给我"),
                 (f"2_{d:03d}", "sadness", f"我真的好难过，第{d}天了")]
    result = evaluate_emotion(_cped(tmp_path, rows), cv=3)
    assert result["in_sample"] is False and result["folds"] == 3
    held = result["held_out"]
    assert len(held["auc"]["per_fold"]) == 3
    assert held["auc"]["mean"] > 0.7
    assert {"auc_length", "auc_exclaim", "key_moment_share", "strong_share"} <= set(held)


def test_cli_json_is_the_last_line_and_bad_input_is_one_line(tmp_path: Path) -> None:
    app = typer.Typer()
    register(app)

    @app.command("noop")
    def noop() -> None:  # a second command keeps typer in multi-command mode
        """Nothing."""

    result = CliRunner().invoke(app, ["emotion", "--data", str(_cped(tmp_path)), "--json"])
    assert result.exit_code == 0, result.output
    last = json.loads(result.output.strip().splitlines()[-1])
    assert last["in_sample"] is False and last["auc"] >= 0.75
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n", encoding="utf-8")
    failed = CliRunner().invoke(app, ["emotion", "--data", str(bad)])
    assert failed.exit_code == 2
    assert "not an ESConv line" in failed.output
    with pytest.raises(ValueError, match="not an ESConv line"):
        read_esconv(bad)


def test_lexicon_only_scoring_is_reported(tmp_path: Path) -> None:
    result = evaluate_emotion(_cped(tmp_path), use_model=False)
    assert result["scorer"] == "lexicon"
    assert evaluate_emotion(_cped(tmp_path))["scorer"] == "shipped"
