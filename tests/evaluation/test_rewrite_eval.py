"""`evaluate_rewrite` and the ``rewrite`` subcommand on tiny files in each format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from contextmode.evaluation.rewrite import (
    detect_rewrite_format,
    evaluate_rewrite,
    harm_rate,
    load_rewrite_items,
    register,
)

RESTORATION = "\n".join("\t".join(r) for r in [
    ["", "你知道王菲吗", "知道啊", "王菲是歌坛天后", "她老公是谁", "不知道", "1", "王菲老公是谁"],
    ["", "", "", "你好", "北京今天天气怎么样", "晴", "0", ""],
    ["", "", "想吃火锅", "重庆火锅好吃", "好辣", "是啊", "1", "重庆火锅好辣"],
]) + "\n"
SU2019 = "\n".join("\t\t".join(r) for r in [
    ["你知道王菲吗", "王菲是歌坛天后", "她老公是谁", "王菲老公是谁"],
    ["你知道左右岸烧烤吗", "当然知道", "在哪里", "左右岸烧烤在哪里"],
]) + "\n"
CANARD = [
    {"History": ["Frank Zappa", "Disbandment", "What group disbanded?",
                 "Zappa and the Mothers of Invention"],
     "Question": "When was he born?", "Rewrite": "When was Frank Zappa born?"},
    {"History": ["Frank Zappa", "Disbandment"], "Question": "What group disbanded?",
     "Rewrite": "What group disbanded?"},
]
HEADLINE = {"exact_match", "restoration_f1", "bleu", "baseline_exact_match",
            "baseline_restoration_f1", "baseline_bleu"}


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, Path]:
    paths = {"restoration": tmp_path / "valid.txt", "su2019": tmp_path / "train18k.txt",
             "canard": tmp_path / "dev.json"}
    paths["restoration"].write_text(RESTORATION, encoding="utf-8")
    paths["su2019"].write_text(SU2019, encoding="utf-8")
    paths["canard"].write_text(json.dumps(CANARD), encoding="utf-8")
    return paths


def test_format_detection(files: dict[str, Path]) -> None:
    for kind, path in files.items():
        assert detect_rewrite_format(path.read_text(encoding="utf-8")) == kind
    with pytest.raises(ValueError):
        detect_rewrite_format("one line of prose")


def test_restoration_label_zero_items_reference_the_message(files: dict[str, Path]) -> None:
    fmt, items = load_rewrite_items(files["restoration"])
    assert fmt == "restoration" and len(items) == 3
    assert items[0].context == ("你知道王菲吗", "知道啊", "王菲是歌坛天后")
    assert items[1].reference == items[1].message == "北京今天天气怎么样"


def test_harm_and_changes_when_not_needed(files: dict[str, Path]) -> None:
    result = evaluate_rewrite(files["restoration"], progress=False)
    assert result["n_not_needed"] == 1 and result["changed_when_not_needed"] == 0.0
    assert result["harm_rate"] == 0.0 and result["in_sample"] is False
    # an inserted word the reference lacks, or a reference word deleted, is harm
    assert harm_rate(["它在哪？"], ["杭州在哪？"], ["楼外楼在哪？"]) == 1.0
    assert harm_rate(["它在哪？"], ["楼外楼在哪？"], ["楼外楼在哪？"]) == 0.0
    assert harm_rate(["它在哪？"], ["它在哪？"], ["楼外楼在哪？"]) == 0.0


@pytest.mark.parametrize("kind", ["restoration", "su2019", "canard"])
def test_evaluate_each_format(files: dict[str, Path], kind: str) -> None:
    result = evaluate_rewrite(files[kind], progress=False)
    assert result["format"] == kind
    assert set(result) >= HEADLINE
    # the pronoun item is resolved exactly in every file, doing nothing never restores
    assert result["exact_match"] > result["baseline_exact_match"]
    assert result["restoration_f1"] > 0 == result["baseline_restoration_f1"]
    assert result["bleu"] >= result["baseline_bleu"]


def test_limit_samples_with_a_fixed_seed(files: dict[str, Path]) -> None:
    _, first = load_rewrite_items(files["su2019"], limit=1)
    _, again = load_rewrite_items(files["su2019"], limit=1)
    assert first == again and len(first) == 1


def test_cli_json_last_line(files: dict[str, Path]) -> None:
    app = typer.Typer()
    register(app)

    @app.command("noop")
    def noop() -> None:
        """Nothing."""

    result = CliRunner().invoke(app, ["rewrite", "--data", str(files["canard"]), "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output.strip().splitlines()[-1])
    assert set(figures) >= HEADLINE
