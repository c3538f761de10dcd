"""Constraint / user-fact extraction against Multi-Session Chat (MSC) persona annotations.

Input: ``personasummary_s*_*.txt``, one JSON dialogue a line, ``dialog:[{id, text,
persona_text?}]``; an utterance's ``persona_text`` is the gold fact(s) it reveals about its
speaker. Every utterance (both speakers) goes through `OfflineConstraintExtractor`.

The matching rules (also in docs/quality.md):

* gold facts: the utterance's ``persona_text`` split into sentences; words compared are
  `contextmode.processors.fact_scorer.fact_words` (lower case, stop words and fillers
  dropped, irregular forms mapped, number words as digits, crude suffix stripping);
* *coverage* (headline ``precision``/``recall``/``f1``): a value and a gold fact match when
  their shared content words make at least ``min_overlap`` (0.5) of the gold fact's content
  words OR at least ``min_overlap`` of the value's — one states at least half of the other;
* *strict* (``strict_*``): the shared words must make ``min_overlap`` of both sides;
* matching is only within one utterance; precision = extracted values that match a gold fact
  of their utterance / all extracted values (values from utterances without
  ``persona_text`` are all false positives); recall = gold facts matched by some value
  extracted from their utterance / all gold facts;
* ``utterance_recall`` (looser, reported beside) = utterances with ``persona_text`` where
  at least one extracted value matches (coverage) / utterances with ``persona_text``;
* ``lenient_*`` (kept from earlier reports): a value counts when ``min_overlap`` of its words
  occur anywhere in the utterance's ``persona_text``, a gold fact when ``min_overlap`` of its
  words occur in the union of the utterance's values.

Baselines scored with the same rule: ``whole_utterance`` (the whole utterance as one value)
and ``first_person`` (every clause starting with I/my).

P/R/F1 are computed privately here until the shared ``evaluation.metrics`` lands.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from ..processors.constraints import OfflineConstraintExtractor
from ..processors.fact_scorer import fact_words as content_words
from .report import JsonFlag, in_sample, print_figures, print_json_line, progress_steps

__all__ = ["MatchRule", "evaluate_constraints", "facts_cover", "facts_match", "read_dialogues", "register"]

MatchRule = Literal["coverage", "strict", "lenient"]


@dataclass(frozen=True, kw_only=True)
class _Counts:
    extracted: int = 0
    matched_extracted: int = 0
    gold: int = 0
    matched_gold: int = 0
    gold_utterances: int = 0
    matched_utterances: int = 0

    def add(self, other: _Counts) -> _Counts:
        return _Counts(**{k: getattr(self, k) + getattr(other, k) for k in self.__dataclass_fields__})

    def figures(self) -> dict[str, float]:
        precision = self.matched_extracted / self.extracted if self.extracted else 0.0
        recall = self.matched_gold / self.gold if self.gold else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        return {
            "precision": round(precision, 4),
            "recall": round(recall, 4),
            "f1": round(f1, 4),
            "utterance_recall": round(
                self.matched_utterances / self.gold_utterances if self.gold_utterances else 0.0, 4
            ),
        }


def _gold_facts(persona_text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", persona_text) if content_words(s)]


def facts_match(value: str, gold: str, min_overlap: float = 0.5) -> bool:
    """The matching rule: shared content words cover ``min_overlap`` of both sides."""
    value_words = set(content_words(value))
    gold_words = set(content_words(gold))
    if not value_words or not gold_words:
        return False
    shared = len(value_words & gold_words)
    return shared / len(value_words) >= min_overlap and shared / len(gold_words) >= min_overlap


def facts_cover(value: str, gold: str, min_overlap: float = 0.5) -> bool:
    """The coverage rule: shared content words cover ``min_overlap`` of either side."""
    value_words = set(content_words(value))
    gold_words = set(content_words(gold))
    if not value_words or not gold_words:
        return False
    shared = len(value_words & gold_words)
    return shared / len(gold_words) >= min_overlap or shared / len(value_words) >= min_overlap


def _covered(words: set[str], pool: set[str], min_overlap: float) -> bool:
    return bool(words) and len(words & pool) / len(words) >= min_overlap


def _score_utterance(
    values: Sequence[str], persona_text: str, min_overlap: float, rule: MatchRule = "coverage"
) -> _Counts:
    gold = _gold_facts(persona_text) if persona_text else []
    if rule == "lenient":
        persona_words = set(content_words(persona_text))
        value_words = {w for v in values for w in content_words(v)}
        matched_values = sum(
            1 for v in values if _covered(set(content_words(v)), persona_words, min_overlap)
        )
        matched_gold = sum(
            1 for g in gold if _covered(set(content_words(g)), value_words, min_overlap)
        )
    else:
        match = facts_cover if rule == "coverage" else facts_match
        matched_values = sum(1 for v in values if any(match(v, g, min_overlap) for g in gold))
        matched_gold = sum(1 for g in gold if any(match(v, g, min_overlap) for v in values))
    return _Counts(
        extracted=len(values),
        matched_extracted=matched_values,
        gold=len(gold),
        matched_gold=matched_gold,
        gold_utterances=1 if gold else 0,
        matched_utterances=1 if gold and matched_values else 0,
    )


def _whole_utterance(text: str) -> list[str]:
    return [text]


def _first_person(text: str) -> list[str]:
    return [
        m.group().strip()
        for m in re.finditer(r"(?<![A-Za-z'])(?:I|I'm|I've|My)\s+[^,.;!?]{3,}", text)
    ]


def read_dialogues(path: Path) -> Iterable[list[dict[str, Any]]]:
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)["dialog"]


_RULES: tuple[MatchRule, ...] = ("coverage", "strict", "lenient")
_BASELINES: dict[str, Callable[[str], list[str]]] = {
    "whole_utterance": _whole_utterance,
    "first_person": _first_person,
}


@dataclass
class _Tally:
    """Counts under each matching rule, for the extractor and for the baselines."""

    totals: dict[MatchRule, _Counts] = field(default_factory=lambda: {rule: _Counts() for rule in _RULES})
    baselines: dict[tuple[str, MatchRule], _Counts] = field(
        default_factory=lambda: {(name, rule): _Counts() for name in _BASELINES for rule in _RULES}
    )
    kinds: dict[str, int] = field(default_factory=dict)
    utterances: int = 0

    def add(self, utterance: dict[str, Any], extractor: OfflineConstraintExtractor, min_overlap: float) -> None:
        self.utterances += 1
        text = utterance.get("text", "")
        persona = utterance.get("persona_text") or ""
        update = extractor.extract_text(text)
        for c in update.upsert:
            self.kinds[c.kind] = self.kinds.get(c.kind, 0) + 1
        values = [c.value for c in update.upsert]
        for rule in _RULES:
            self.totals[rule] = self.totals[rule].add(_score_utterance(values, persona, min_overlap, rule))
        for name, system in _BASELINES.items():
            produced = system(text)
            for rule in _RULES:
                self.baselines[name, rule] = self.baselines[name, rule].add(
                    _score_utterance(produced, persona, min_overlap, rule)
                )


def _other_rules(
    totals: dict[MatchRule, _Counts], baselines: dict[tuple[str, MatchRule], _Counts]
) -> dict[str, float]:
    """The figures under the strict and lenient rules, and the baselines' under every rule."""
    result: dict[str, float] = {}
    for rule in ("strict", "lenient"):
        for key, value in totals[rule].figures().items():
            if key != "utterance_recall":
                result[f"{rule}_{key}"] = value
    for (name, rule), counts in baselines.items():
        prefix = f"baseline_{name}_" if rule == "coverage" else f"baseline_{name}_{rule}_"
        for key, value in counts.figures().items():
            if key != "utterance_recall":
                result[prefix + key] = value
    return result


def evaluate_constraints(
    path: str | Path,
    *,
    min_overlap: float = 0.5,
    generic_facts: bool = True,
    limit: int | None = None,
    show_progress: bool = False,
    extractor: OfflineConstraintExtractor | None = None,
) -> dict[str, Any]:
    """Precision / recall of `OfflineConstraintExtractor` on an MSC persona file.

    Returns ``precision``, ``recall``, ``f1``, ``utterance_recall`` (coverage rule),
    ``strict_*`` and ``lenient_*`` under the other rules, item counts, the share of values
    per kind, and the same figures for the two baselines (``baseline_*``). ``extractor``
    replaces the default one (e.g. with another `FactScorer`).
    """
    dialogues = list(read_dialogues(Path(path)))[:limit]
    extractor = extractor or OfflineConstraintExtractor(generic_facts=generic_facts)
    tally = _Tally()
    with progress_steps("extracting", len(dialogues), show_progress) as step:
        for dialog in dialogues:
            for utterance in dialog:
                tally.add(utterance, extractor, min_overlap)
            step()
    totals, baselines, kinds, utterances = tally.totals, tally.baselines, tally.kinds, tally.utterances
    strict = totals["strict"].figures()
    result: dict[str, Any] = {
        # Headline: a pin counts only when it is a whole, true statement of the gold persona.
        "strict_precision": strict["precision"],
        "strict_recall": strict["recall"],
        # The shipped English fact scorer was trained on the MSC dev files: say so.
        "in_sample": extractor.fact_scorer is None and generic_facts and in_sample(path, "fact_scorer"),
        **totals["coverage"].figures(),
        "rule": "coverage",
        "dialogues": len(dialogues),
        "utterances": utterances,
        "gold_facts": totals["coverage"].gold,
        "extracted": totals["coverage"].extracted,
        "min_overlap": min_overlap,
        "kinds": kinds,
    }
    result.update(_other_rules(totals, baselines))
    return result


def register(app: typer.Typer) -> None:
    """Add the ``constraints`` evaluation subcommand to ``app``."""

    @app.command("constraints")
    def constraints_command(
        data: Annotated[Path, typer.Option("--data", help="MSC personasummary_s*.txt file")],
        min_overlap: Annotated[float, typer.Option(help="Matching rule: content-word overlap")] = 0.5,
        generic_facts: Annotated[bool, typer.Option(help="Also extract untyped first-person facts")] = True,
        limit: Annotated[int | None, typer.Option(help="Only the first N dialogues")] = None,
        as_json: JsonFlag = False,
    ) -> None:
        """Constraint / user-fact extraction precision and recall on MSC."""
        result = evaluate_constraints(
            data, min_overlap=min_overlap, generic_facts=generic_facts, limit=limit,
            show_progress=True,
        )
        print_figures("constraint extraction (MSC)", result)
        if as_json:
            print_json_line(result)
