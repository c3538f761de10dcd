"""The LoCoMo evidence-recall evaluation, on a tiny synthetic file in LoCoMo's format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from contextmode.evaluation import locomo
from contextmode.evaluation.locomo import evaluate_locomo, load_locomo
from contextmode.testing.counters import CharTokenCounter

_FILLER = [
    "The weather was grey all day so I stayed in and tidied the flat.",
    "Work has been busy, lots of meetings about the quarterly report.",
    "I tried a new soup recipe, it needed more salt honestly.",
    "Traffic was terrible this morning, the bus was twenty minutes late.",
    "We watched a documentary about whales last night, pretty relaxing.",
    "My neighbour's dog keeps barking at the postman every morning.",
]


def _sample(path: Path) -> Path:
    sessions: dict[str, object] = {}
    dates = ["1:56 pm on 8 May, 2023", "10:00 am on 20 June, 2023", "7:30 pm on 2 August, 2023"]
    for n, date in enumerate(dates, 1):
        turns = []
        for i in range(1, 31):
            speaker = "Anna" if i % 2 else "Ben"
            text = _FILLER[(i + n) % len(_FILLER)]
            if (n, i) == (1, 5):
                text = "I finally adopted a tabby kitten and named her Marmalade."
            if (n, i) == (1, 6):
                text = "What a lovely name!"
            if (n, i) == (2, 9):
                text = "I ran my first half marathon in Lisbon last weekend."
            turn = {"speaker": speaker, "dia_id": f"D{n}:{i}", "text": text}
            if (n, i) == (2, 10):
                turn["blip_caption"] = "a photo of a medal on a table"
            turns.append(turn)
        sessions[f"session_{n}_date_time"] = date
        sessions[f"session_{n}"] = turns
    data = [{
        "sample_id": "synthetic-1",
        "conversation": {"speaker_a": "Anna", "speaker_b": "Ben", **sessions},
        "qa": [
            {"question": "What is the name of Anna's kitten?", "answer": "Marmalade",
             "evidence": ["D1:5"], "category": 4},
            {"question": "When did Anna run the half marathon in Lisbon?", "answer": "June 2023",
             "evidence": ["D2:9"], "category": 2},
            {"question": "What about the kitten and the marathon Anna mentioned?", "answer": "kitten, marathon",
             "evidence": ["D1:5", "D2:9"], "category": 1},
            {"question": "What did Ben say about Anna's pet snake?", "answer": "",
             "evidence": [], "category": 5},
        ],
    }]
    file = path / "locomo_tiny.json"
    file.write_text(json.dumps(data), encoding="utf-8")
    return file


def test_load_locomo_parses_sessions_dates_and_captions(tmp_path: Path) -> None:
    (conv,) = load_locomo(_sample(tmp_path))
    assert conv.speaker_a == "Anna" and len(conv.turns) == 90
    assert conv.turns[0].at.isoformat() == "2023-05-08T13:56:00+00:00"
    medal = next(t for t in conv.turns if t.dia_id == "D2:10")
    assert medal.text.endswith("[shares a photo: a photo of a medal on a table]")
    assert [q.category for q in conv.questions] == [4, 2, 1, 5]


def test_evaluate_locomo_measures_evidence_per_strategy_and_budget(tmp_path: Path) -> None:
    result = evaluate_locomo(
        _sample(tmp_path), [300, 1200], ["window", "hybrid_recall"],
        progress=False, counter=CharTokenCounter(),
    )
    table = result["table"]
    assert result["departures"] == []  # measured as shipped: nothing departs
    assert set(result["recall"]) == {"window", "hybrid_recall"}
    assert set(result["recall"]["window"]) == {"300", "1200"}
    row = table["hybrid_recall"]["1200"]
    assert row["questions"] == 3  # category 5 is left out
    assert set(row["by_category"]) == {"multi-hop", "temporal", "single-hop"}
    # The planted facts are far outside the window: only recall brings them back.
    assert result["recall"]["window"]["1200"] == 0.0
    assert result["recall"]["hybrid_recall"]["1200"] == 1.0
    assert result["recall"]["hybrid_recall"]["300"] <= result["recall"]["hybrid_recall"]["1200"]
    for by_budget in table.values():
        for budget, cell in by_budget.items():
            assert 0 < cell["tokens"] <= int(budget)
            assert 0.0 <= cell["summary_only"] <= 1.0


def test_cli_prints_json_last(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(locomo, "_cl100k", CharTokenCounter)
    app = typer.Typer()
    locomo.register(app)

    @app.command("noop")
    def _noop() -> None:  # a second command keeps typer from collapsing the group
        pass

    out = CliRunner().invoke(app, [
        "locomo", "--data", str(_sample(tmp_path)), "--budget", "800",
        "--strategy", "sliding_summary,hybrid_recall", "--json",
    ])
    assert out.exit_code == 0, out.output
    last = json.loads(out.output.strip().splitlines()[-1])
    assert set(last["recall"]) == {"sliding_summary", "hybrid_recall"}
    assert last["recall"]["hybrid_recall"]["800"] > last["recall"]["sliding_summary"]["800"]


def test_plot_recall_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    result = {"counter": "test", "recall": {"window": {"1000": 0.1, "2000": 0.2},
                                            "hybrid_recall": {"1000": 0.6, "2000": 0.8}}}
    out = locomo.plot_recall(result, tmp_path / "img" / "recall.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_shipped_default_is_measured_and_departures_are_named(tmp_path: Path) -> None:
    data = _sample(tmp_path)
    result = evaluate_locomo(data, [1200], ["default"], progress=False, counter=CharTokenCounter())
    assert result["departures"] == [] and "Engine" in result["entry"]
    assert result["recall"]["default"]["1200"] == 1.0
    assert set(result["table"]["default"]["1200"]["by_category"]) == {"multi-hop", "temporal", "single-hop"}
    other = evaluate_locomo(data, [1200], ["default"], progress=False, counter=CharTokenCounter(),
                            options=locomo.EvalOptions(preferences_only=True))
    assert other["departures"] == ["constraint extractor generic_facts=False (shipped: True)"]


def test_a_progress_bar_counts_the_questions_and_the_table_is_aligned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One bar over every question asked (categories 1-4 of every conversation), saying which
    conversation it is at; the results in a table whose columns line up."""
    import io

    from rich.console import Console
    from rich.progress import MofNCompleteColumn, Progress, TextColumn

    from contextmode.evaluation import report

    shown = io.StringIO()
    bars: list[Progress] = []

    def recording_bar() -> Progress:
        bar = Progress(TextColumn("{task.description}"), MofNCompleteColumn(),
                       console=Console(file=shown, force_terminal=True, width=120), transient=False)
        bars.append(bar)
        return bar

    monkeypatch.setattr(report, "progress_bar", recording_bar)
    monkeypatch.setattr(locomo, "_cl100k", CharTokenCounter)
    app = typer.Typer()
    locomo.register(app)

    @app.command("noop")
    def _noop() -> None:
        pass

    out = CliRunner().invoke(app, [
        "locomo", "--data", str(_sample(tmp_path)), "--budget", "800,1200", "--strategy", "window,hybrid_recall",
    ])
    assert out.exit_code == 0, out.output
    (bar,) = bars
    (task,) = bar.tasks
    assert (task.completed, task.total) == (3, 3)  # three questions of categories 1-4
    assert "synthetic-1 (1/1)" in shown.getvalue() and "3/3" in shown.getvalue()
    assert "[locomo]" not in out.output  # no plain progress lines any more
    lines = [line for line in out.output.splitlines() if "│" in line or "┃" in line]
    assert len(lines) == 5  # the header and one row per strategy and budget
    assert len({len(line) for line in lines}) == 1
    bars_at = {i for i, ch in enumerate(lines[0]) if ch in "┃│"}
    assert all({i for i, ch in enumerate(line) if ch in "┃│"} == bars_at for line in lines)
