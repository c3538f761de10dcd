"""`evaluate_followup` and the ``followup`` subcommand on tiny files written here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from contextmode.evaluation.followup import (
    baseline_predictions,
    evaluate_followup,
    load_detection_items,
    register,
)

RESTORATION = [
    ["你知道王菲吗", "知道", "她是歌坛天后", "对", "举个例子", "好的", "1", "举个王菲的例子"],
    ["", "", "", "你好", "北京今天天气怎么样", "晴", "0", ""],
    ["什么是机器学习", "一种方法", "哦", "嗯", "那深度学习呢", "也是", "1", "那深度学习是什么"],
    ["", "", "早", "早上好", "请介绍一下Python的装饰器", "好", "0", ""],
]
CANARD = [
    {"History": ["Frank Zappa", "Disbandment"], "Question": "What group disbanded?",
     "Rewrite": "What group disbanded?"},
    {"History": ["Frank Zappa", "Disbandment", "What group disbanded?", "The Mothers"],
     "Question": "When did they disband?", "Rewrite": "When did the Mothers disband?"},
]
HEADLINE = {"accuracy", "precision", "recall", "f1", "macro_f1"}


@pytest.fixture()
def restoration_file(tmp_path: Path) -> Path:
    path = tmp_path / "valid.txt"
    path.write_text("\n".join("\t".join(r) for r in RESTORATION) + "\n", encoding="utf-8")
    return path


@pytest.fixture()
def canard_file(tmp_path: Path) -> Path:
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(CANARD), encoding="utf-8")
    return path


def test_loads_both_formats(restoration_file: Path, canard_file: Path) -> None:
    items = load_detection_items(restoration_file)
    assert [i.needs_context for i in items] == [True, False, True, False]
    assert items[1].context == ("你好",)
    canard = load_detection_items(canard_file)
    assert [i.needs_context for i in canard] == [False, True]


def test_rejects_other_files(tmp_path: Path) -> None:
    path = tmp_path / "x.txt"
    path.write_text("just some text\n", encoding="utf-8")
    with pytest.raises(ValueError):
        load_detection_items(path)


def test_evaluate_restoration(restoration_file: Path) -> None:
    result = evaluate_followup(restoration_file, progress=False)
    assert set(result) >= HEADLINE
    assert result["n"] == 4 and result["positives"] == 2
    assert result["accuracy"] == 1.0  # the four messages are clear-cut
    assert result["baselines"]["always_yes"]["recall"] == 1.0
    assert result["baselines"]["always_yes"]["accuracy"] == 0.5


def test_evaluate_canard(canard_file: Path) -> None:
    result = evaluate_followup(canard_file, progress=False)
    assert result["n"] == 2 and result["positives"] == 1
    assert 0.0 <= result["macro_f1"] <= 1.0


def test_baselines_with_fixed_cutoff(restoration_file: Path) -> None:
    items = load_detection_items(restoration_file)
    preds = baseline_predictions(items, length_cutoff=6)
    assert preds["length<=6"] == [True, False, True, False]
    assert preds["pronoun_list"] == [False, False, False, False]


def test_cli_json_last_line(restoration_file: Path) -> None:
    app = typer.Typer()
    register(app)

    @app.command("noop")
    def noop() -> None:  # a second command keeps typer in multi-command mode
        """Nothing."""

    result = CliRunner().invoke(app, ["followup", "--data", str(restoration_file), "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output.strip().splitlines()[-1])
    assert set(figures) >= HEADLINE


def test_in_sample_is_said_for_the_training_file(tmp_path: Path) -> None:
    folder = tmp_path / "restoration200k"
    folder.mkdir()
    path = folder / "valid.txt"
    path.write_text("\n".join("\t".join(r) for r in RESTORATION) + "\n", encoding="utf-8")
    assert evaluate_followup(path, progress=False)["in_sample"] is True
    other = tmp_path / "other.txt"
    other.write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    assert evaluate_followup(other, progress=False)["in_sample"] is False
