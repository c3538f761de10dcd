"""Context-dependence detection measured on labelled dialogues.

Accepted files (the format is recognised from the content):

* Restoration-200K (Pan et al. 2019): 8 tab-separated fields per line,
  ``ctx1 ctx2 ctx3 ctx4 current next_reply label rewrite``; ``label`` 1 = the current
  utterance needs its context.
* CANARD (Elgohary et al. 2019): a JSON list of ``{History, Question, Rewrite}``; an
  item needs context when its ``Rewrite`` differs from its ``Question``.

`evaluate_followup` scores `OfflineContextDetector` (shipped model + keyword follow-up intents)
and three simple baselines: always "needs context", a pronoun/demonstrative list
(the ``pronoun`` intent's keywords plus 他/她), and a length cut-off (messages of at most
``length_cutoff`` characters — words for English — need context).

Note: the shipped model was trained on the Restoration-200K dev file and CANARD dev; the
figure for those files is a training-set fit. The honest dev figure is the k-fold
cross-validation printed by ``scripts/train_detector.py``; on any other file of the
same format this command measures generalisation.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from ..processors.detect import DetectorModel, OfflineContextDetector
from ..processors.intents import INTENT_KEYWORDS
from ..text import is_chinese
from .metrics import binary_scores
from .report import JsonFlag, in_sample, print_json_line, progress_steps

__all__ = [
    "DetectionItem",
    "baseline_predictions",
    "evaluate_followup",
    "load_detection_items",
    "print_followup_table",
    "register",
]

_ZH_PRONOUNS = (*INTENT_KEYWORDS["pronoun"]["zh"], "他", "她")
_EN_PRONOUN = re.compile(
    r"\b(it|its|they|them|their|he|him|his|she|her|this|that|these|those|one)\b", re.I
)


@dataclass(frozen=True, kw_only=True)
class DetectionItem:
    """One labelled message with the turns before it."""

    message: str
    context: tuple[str, ...]
    """Earlier turn texts, oldest first."""
    needs_context: bool
    rewrite: str = ""
    """The reference standalone rewrite, when the dataset has one."""


def _read_text(path: Path) -> str:
    return path.read_text(encoding="utf-8-sig")


def load_detection_items(path: str | Path) -> list[DetectionItem]:
    """Labelled items of a Restoration-200K or CANARD file (format read from the content)."""
    path = Path(path)
    text = _read_text(path)
    if text.lstrip().startswith("["):
        return [
            DetectionItem(
                message=item["Question"],
                context=tuple(item.get("History") or ()),
                needs_context=item["Question"].strip() != item["Rewrite"].strip(),
                rewrite=item["Rewrite"],
            )
            for item in json.loads(text)
        ]
    items: list[DetectionItem] = []
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) < 7 or fields[6].strip() not in {"0", "1"}:
            continue
        items.append(
            DetectionItem(
                message=fields[4],
                context=tuple(f for f in fields[:4] if f.strip()),
                needs_context=fields[6].strip() == "1",
                rewrite=fields[7] if len(fields) > 7 else "",
            )
        )
    if not items:
        raise ValueError(f"{path}: neither a Restoration-200K TSV nor a CANARD JSON list")
    return items


def _has_pronoun(message: str) -> bool:
    if is_chinese(message):
        return any(p in message for p in _ZH_PRONOUNS)
    return bool(_EN_PRONOUN.search(message))


def _length(message: str) -> int:
    return len(message.strip()) if is_chinese(message) else len(message.split())


def baseline_predictions(
    items: Sequence[DetectionItem], *, length_cutoff: int | None = None
) -> dict[str, list[bool]]:
    """Predictions of the always-yes, pronoun-list and length baselines.

    ``length_cutoff`` defaults to the best cut-off on ``items`` themselves (by
    macro-F1), which flatters that baseline on purpose: it is an upper bound.
    """
    gold = [i.needs_context for i in items]
    lengths = [_length(i.message) for i in items]
    if length_cutoff is None:
        candidates = sorted(set(lengths))[:60]
        length_cutoff = max(
            candidates,
            key=lambda c: binary_scores(gold, [n <= c for n in lengths])["macro_f1"],
            default=0,
        )
    return {
        "always_yes": [True] * len(items),
        "pronoun_list": [_has_pronoun(i.message) for i in items],
        f"length<={length_cutoff}": [n <= length_cutoff for n in lengths],
    }


def evaluate_followup(
    path: str | Path,
    *,
    progress: bool = True,
    limit: int | None = None,
    model: DetectorModel | None = None,
) -> dict[str, Any]:
    """Score the offline detector and the baselines on a labelled file.

    Returns the detector's ``accuracy``, ``precision``, ``recall``, ``f1``,
    ``macro_f1`` (0–1), ``n``, ``positives``, ``in_sample`` (True when the shipped model
    was trained on ``path``) and ``baselines`` (name → the same figures).
    """
    items = load_detection_items(path)[:limit]
    detector = OfflineContextDetector(model)
    predicted: list[bool] = []
    with progress_steps("detecting", len(items), progress) as step:
        for item in items:
            predicted.append(detector.detect_texts(item.message, item.context).needs_context)
            step()
    gold = [i.needs_context for i in items]
    scores = binary_scores(gold, predicted)
    result: dict[str, Any] = {k: scores[k] for k in
                              ("accuracy", "precision", "recall", "f1", "macro_f1")}
    result["n"] = len(items)
    result["positives"] = sum(gold)
    # The shipped detector (model=None) was trained on the dev files: say so.
    result["in_sample"] = model is None and in_sample(path, "detector")
    result["baselines"] = {
        name: {k: s[k] for k in ("accuracy", "precision", "recall", "f1", "macro_f1")}
        for name, preds in baseline_predictions(items).items()
        for s in [binary_scores(gold, preds)]
    }
    return result


def print_followup_table(result: dict[str, Any], title: str = "context-dependence detection") -> None:
    """A rich table: the detector, then each baseline, one row each."""
    from rich.console import Console
    from rich.table import Table

    flag = " — IN SAMPLE: the shipped detector was trained on this data" if result.get("in_sample") else ""
    table = Table(title=f"{title} (n={result['n']}, positives={result['positives']}){flag}")
    columns = ("accuracy", "precision", "recall", "f1", "macro_f1")
    table.add_column("system")
    for column in columns:
        table.add_column(column, justify="right")
    rows = {"offline detector": result, **result["baselines"]}
    for name, figures in rows.items():
        table.add_row(name, *(f"{figures[c]:.3f}" for c in columns))
    Console().print(table)


def register(app: typer.Typer) -> None:
    """Add the ``followup`` evaluation subcommand to ``app``."""

    @app.command("followup")
    def followup_command(
        data: Annotated[Path, typer.Option("--data", help="Restoration-200K TSV or CANARD JSON")],
        limit: Annotated[int | None, typer.Option(help="Only the first N items")] = None,
        as_json: JsonFlag = False,
    ) -> None:
        """Accuracy, P/R/F1 and macro-F1 of the context-dependence detector vs baselines."""
        result = evaluate_followup(data, limit=limit)
        print_followup_table(result)
        if as_json:
            print_json_line(result)
