"""English fact clause scorer: clause splitting, canonical form, scoring, shipped model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contextmode.errors import ConfigError
from contextmode.processors.constraints import OfflineConstraintExtractor, canonical_fact
from contextmode.processors.fact_scorer import (
    FORMAT,
    FactScorer,
    candidates,
    default_scorer,
    fact_words,
    split_clauses,
)


def test_split_clauses_cleans_fillers_and_marks_questions() -> None:
    clauses = split_clauses("Yeah, lol I have two dogs and I love hiking. Do you hike much?")
    assert [c.text for c in clauses] == ["I have two dogs", "I love hiking", "Do you hike much"]
    assert [c.question for c in clauses] == [False, False, True]
    assert [c.index for c in clauses] == [0, 1, 2] and clauses[0].count == 3


def test_candidates_skip_bare_pronoun_objects() -> None:
    texts = [c.text for c in candidates("I love it, my wife is a nurse.")]
    assert texts == ["my wife is a nurse"]


def test_fact_words_lemmatise_irregular_forms_and_drop_fillers() -> None:
    assert fact_words("Yeah lol, my kids grew up") == ["kid", "grow", "up"]
    assert fact_words("I have three children.") == ["3", "child"]


def test_canonical_fact_spells_out_first_person() -> None:
    assert canonical_fact("i'm a nurse lol") == "I am a nurse."
    assert canonical_fact("I've two cats") == "I have two cats."
    assert canonical_fact("I dont eat meat") == "I do not eat meat."


def _scorer(threshold: float = 0.5, max_facts: int = 1) -> FactScorer:
    return FactScorer.from_dict({
        "format": FORMAT, "bias": -1.0, "threshold": threshold, "max_facts": max_facts,
        "weights": {"fp": 2.0, "s01=i_have": 1.0, "q": -4.0, "you": -1.0},
    })


def test_scorer_keeps_the_best_clauses_above_threshold_in_turn_order() -> None:
    scorer = _scorer(max_facts=2)
    chosen = scorer.select("Do you have a dog? I have a beagle, my sister owns cats.")
    assert [c.text for c, _ in chosen] == ["I have a beagle", "my sister owns cats"]
    assert chosen[0][1] > chosen[1][1] >= 0.5
    assert [c.text for c, _ in _scorer(max_facts=1).select("Do you? I have a beagle")] == [
        "I have a beagle"
    ]
    assert _scorer(threshold=0.99).select("I have a beagle") == []


def test_model_file_errors_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        FactScorer.from_dict({"format": "other"})
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"format": FORMAT, "bias": 0}), encoding="utf-8")
    with pytest.raises(ConfigError):
        FactScorer.load(path)


def test_shipped_model_loads_and_picks_self_disclosure() -> None:
    scorer = default_scorer()
    assert scorer is not None and 0 < scorer.threshold < 1 and scorer.max_facts >= 1
    ex = OfflineConstraintExtractor()
    values = [c.value for c in ex.extract_text(
        "Oh wow, that sounds fun! I work as a welder and my husband drives a truck."
    ).upsert]
    assert any("welder" in v for v in values)
    assert not any("sounds fun" in v for v in values)
    for text in ["What kind of music do you like?", "That's awesome, thanks!", "Have fun!"]:
        assert not ex.extract_text(text).upsert, text


def test_custom_scorer_and_patterns_only_extractors() -> None:
    text = "I have a beagle named Max."
    custom = OfflineConstraintExtractor(fact_scorer=_scorer()).extract_text(text).upsert
    assert [c.value for c in custom] == ["I have a beagle named Max."]
    assert custom[0].kind == "fact" and custom[0].quote == "I have a beagle named Max"
    patterns = OfflineConstraintExtractor(fact_scorer=False).extract_text(text).upsert
    assert patterns and patterns[0].kind == "fact"
