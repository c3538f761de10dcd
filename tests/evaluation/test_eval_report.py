"""The shared evaluation output helpers: table, JSON last line, --json flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from contextmode.evaluation.report import (
    JsonFlag,
    print_figures,
    print_json_line,
    progress_bar,
    progress_steps,
)


def test_print_json_line_keeps_chinese_readable(capsys: pytest.CaptureFixture[str]) -> None:
    print_json_line({"名字": "小明", "f1": 0.5})
    out = capsys.readouterr().out
    assert out == '{"名字": "小明", "f1": 0.5}\n'
    assert json.loads(out) == {"名字": "小明", "f1": 0.5}


def test_print_figures_lists_every_figure(capsys: pytest.CaptureFixture[str]) -> None:
    print_figures("demo", {"precision": 0.75, "n": 4})
    out = capsys.readouterr().out
    assert "demo" in out and "precision" in out and "0.75" in out and "n" in out


def test_progress_bar_is_transient() -> None:
    bar = progress_bar()
    assert bar.live.transient is True


@pytest.mark.parametrize("show", [False, True])
def test_progress_steps_runs_the_body_and_closes_on_error(show: bool) -> None:
    done = []
    with progress_steps("work", 3, show) as step:
        for i in range(3):
            done.append(i)
            step()
    assert done == [0, 1, 2]
    with pytest.raises(KeyError), progress_steps("work", 1, show) as step:
        raise KeyError("boom")


def test_json_flag_is_reusable_across_commands() -> None:
    app = typer.Typer()

    @app.command("a")
    def a(as_json: JsonFlag = False) -> None:
        print(f"a={as_json}")

    @app.command("b")
    def b(as_json: JsonFlag = False) -> None:
        print(f"b={as_json}")

    runner = CliRunner()
    assert runner.invoke(app, ["a", "--json"]).output.strip() == "a=True"
    assert runner.invoke(app, ["b"]).output.strip() == "b=False"


def test_in_sample_by_folder_and_name_or_by_content(tmp_path: Path) -> None:
    from contextmode.evaluation.report import in_sample

    folder = tmp_path / "restoration200k"
    folder.mkdir()
    (folder / "valid.txt").write_text("x\n", encoding="utf-8")
    assert in_sample(folder / "valid.txt", "detector")
    assert not in_sample(folder / "valid.txt", "fact_scorer")
    other = tmp_path / "held_out.txt"
    other.write_text("something never trained on\n", encoding="utf-8")
    assert not in_sample(other, "detector")
    assert not in_sample(tmp_path / "missing.txt", "detector")


def test_print_figures_says_in_sample(capsys: pytest.CaptureFixture[str]) -> None:
    print_figures("demo", {"f1": 0.99, "in_sample": True})
    assert "IN SAMPLE" in capsys.readouterr().out
