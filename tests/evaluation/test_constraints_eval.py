"""Constraint evaluation on a tiny MSC-format file written here."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from contextmode.evaluation.constraints import (
    evaluate_constraints,
    facts_cover,
    facts_match,
    register,
)


def _msc(tmp_path: Path) -> Path:
    dialogs = [
        [
            {"id": "a", "text": "I live in Boston and I have two dogs.",
             "persona_text": "I live in Boston. I have two dogs."},
            {"id": "b", "text": "Nice! What do you do for fun?"},
            {"id": "a", "text": "I love hiking in the mountains.",
             "persona_text": "I love hiking."},
            {"id": "b", "text": "I'm allergic to peanuts, so I bake without them.",
             "persona_text": "I'm allergic to peanuts. I like to bake."},
        ]
    ]
    path = tmp_path / "personasummary_s9_valid.txt"
    path.write_text("\n".join(json.dumps({"dialog": d}) for d in dialogs) + "\n", encoding="utf-8")
    return path


def test_matching_rule_needs_overlap_on_both_sides() -> None:
    assert facts_match("lives in Boston", "I live in Boston.")
    assert facts_match("has two dogs", "I have two dogs.")
    assert not facts_match("likes hiking", "I have two dogs.")
    assert not facts_match("I went to a great cafe that opened near the station with my sister",
                           "I went to a cafe.")


def test_coverage_rule_needs_half_of_either_side() -> None:
    # Half of the gold fact is stated: coverage matches, strict does not (value too long).
    assert facts_cover("I went to a great cafe near the station", "I went to a cafe.")
    assert not facts_match("I went to a great cafe near the station", "I went to a cafe.")
    # The whole value is part of a longer gold fact.
    assert facts_cover("I grew roses", "My mom and I grow roses and tulips in the garden.")
    assert not facts_cover("I like hiking", "I have two dogs.")
    # Irregular forms and fillers are normalised; stop words alone never match.
    assert facts_cover("yeah lol my kids", "I have two children and a kid.")
    assert not facts_cover("I am so", "I am.")


def test_evaluate_constraints_counts_precision_and_recall(tmp_path: Path) -> None:
    result = evaluate_constraints(_msc(tmp_path))
    assert result["dialogues"] == 1
    assert result["utterances"] == 4
    assert result["gold_facts"] == 5
    assert result["rule"] == "coverage"
    # The typed patterns read Boston, two dogs, hiking and peanuts; "I like to bake" is only
    # implied ("I bake without them"), so it depends on the shipped clause scorer.
    assert result["precision"] >= 0.75
    assert result["recall"] >= 0.8
    assert result["strict_recall"] <= result["recall"]
    assert "strict_precision" in result and result["in_sample"] is False  # not an MSC dev file
    assert result["baseline_whole_utterance_precision"] < result["precision"]


def test_cli_json_is_the_last_line(tmp_path: Path) -> None:
    app = typer.Typer()
    register(app)

    @app.command("noop")
    def noop() -> None:
        """Nothing."""

    result = CliRunner().invoke(app, ["constraints", "--data", str(_msc(tmp_path)), "--json"])
    assert result.exit_code == 0, result.output
    last = json.loads(result.output.strip().splitlines()[-1])
    assert set(last) >= {"precision", "recall", "f1"}
