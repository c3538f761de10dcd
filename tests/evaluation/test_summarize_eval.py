"""Summary evaluation on a tiny LoCoMo-format file written here."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from contextmode.evaluation.summary import (
    evaluate_summary,
    is_whole_clause,
    register,
    summary_items,
)


def _locomo(tmp_path: Path) -> Path:
    session_1 = [
        {"speaker": "Ann", "dia_id": "D1:1", "text": "Hi Ben! I moved to Denver in 2021 and adopted a cat named Milo."},
        {"speaker": "Ben", "dia_id": "D1:2", "text": "That is great! How is Milo doing?"},
        {"speaker": "Ann", "dia_id": "D1:3", "text": "He is fine. The vet bill was $120 though, and I'm allergic to peanuts."},
    ]
    session_2 = [
        {"speaker": "Ben", "dia_id": "D2:1", "text": "I ran the Boston marathon in 3 hours last week!"},
        {"speaker": "Ann", "dia_id": "D2:2", "text": "Wow, congrats! I started painting landscapes at Lake Tahoe."},
    ]
    sample = {
        "sample_id": "t1",
        "conversation": {"speaker_a": "Ann", "speaker_b": "Ben",
                         "session_1_date_time": "1 May 2023", "session_1": session_1,
                         "session_2_date_time": "8 May 2023", "session_2": session_2},
        "observation": {"session_1_observation": {"Ann": [["Ann adopted a cat named Milo.", "D1:1"]]}},
        "qa": [{"question": "What is Ann's cat called?", "answer": "Milo", "category": 1},
               {"question": "Adversarial", "answer": "x", "category": 5}],
    }
    path = tmp_path / "locomo.json"
    path.write_text(json.dumps([sample]), encoding="utf-8")
    return path


def test_evaluate_summary_counts_kept_facts(tmp_path: Path) -> None:
    result = evaluate_summary(_locomo(tmp_path), block_chars=60)
    assert result["steps"] == 2
    assert result["conversations"] == 1
    assert 0.0 < result["kept_before"] < result["kept_after"] == 1.0
    assert result["qa_items"] == 1
    assert result["qa_answer_in_summary_audited"] == 1.0


def test_cli_json_is_the_last_line(tmp_path: Path) -> None:
    app = typer.Typer()
    register(app)

    @app.command("noop")
    def noop() -> None:
        """Nothing."""

    result = CliRunner().invoke(app, ["summary", "--data", str(_locomo(tmp_path)), "--json"])
    assert result.exit_code == 0, result.output
    last = json.loads(result.output.strip().splitlines()[-1])
    assert {"kept_before", "kept_after"} <= set(last)


def test_summary_items_are_whole_clauses_and_observations_covered(tmp_path: Path) -> None:
    result = evaluate_summary(_locomo(tmp_path), block_chars=60)
    assert result["whole_clause_share"] == 1.0 and result["summary_items"] > 0
    assert result["observations"] == 1 and result["observation_coverage"] == 1.0
    assert result["in_sample"] is False


def test_whole_clause_rule() -> None:
    sources = ["I moved to Denver in 2021, and adopted a cat named Milo."]
    assert is_whole_clause("I moved to Denver in 2021,", sources)
    assert is_whole_clause("and adopted a cat named Milo.", sources)
    assert not is_whole_clause("oved to Denver", sources)
    assert not is_whole_clause("们去过一家云南菜", ["我们去过一家云南菜馆"])
    sentences, facts = summary_items("Ann: I moved. (emotion 4/5) Fine.\nFacts: 2021; Milo")
    assert sentences == ["I moved.", "Fine."] and facts == ["2021", "Milo"]
