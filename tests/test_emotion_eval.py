"""Emotion evaluation on tiny CPED- and ESConv-format files written here."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from contextmode.evaluation.emotion import evaluate_emotion, register


def _cped(tmp_path: Path) -> Path:
    rows = [
        ("1_000", "neutral", "我们明天几点出发"),
        ("1_000", "neutral", "在三号门集合"),
        ("1_000", "anger", "你太过分了！！"),
        ("1_001", "sadness", "我真的好难过"),
        ("1_001", "neutral", "把文件发给我"),
        ("1_001", "happy", "太好了，我好开心"),
    ]
    path = tmp_path / "cped.csv"
    lines = ["TV_ID,Dialogue_ID,Utterance_ID,Speaker,Sentiment,Emotion,Utterance"]
    for i, (dialogue, emotion, text) in enumerate(rows):
        sentiment = "neutral" if emotion == "neutral" else "negative"
        lines.append(f"1,{dialogue},{dialogue}_{i},甲,{sentiment},{emotion},{text}")
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


def test_cped_separates_neutral_from_emotional(tmp_path: Path) -> None:
    result = evaluate_emotion(_cped(tmp_path))
    assert result["dataset"] == "cped"
    assert result["items"] == 6
    assert result["auc"] == 1.0
    assert result["mean_score_emotional"] > result["mean_score_neutral"]


def test_esconv_correlates_with_seeker_intensity(tmp_path: Path) -> None:
    result = evaluate_emotion(_esconv(tmp_path), first_turns=2)
    assert result["dataset"] == "esconv"
    assert result["items"] == 4
    assert result["spearman"] > 0.5


def test_cli_json_is_the_last_line(tmp_path: Path) -> None:
    app = typer.Typer()
    register(app)

    @app.command("noop")
    def noop() -> None:  # a second command keeps typer in multi-command mode
        """Nothing."""

    result = CliRunner().invoke(app, ["emotion", "--data", str(_cped(tmp_path)), "--json"])
    assert result.exit_code == 0, result.output
    last = json.loads(result.output.strip().splitlines()[-1])
    assert last["auc"] == 1.0


def test_lexicon_only_scoring_is_reported(tmp_path: Path) -> None:
    result = evaluate_emotion(_cped(tmp_path), use_model=False)
    assert result["scorer"] == "lexicon"
    assert evaluate_emotion(_cped(tmp_path))["scorer"] == "lexicon+model"
