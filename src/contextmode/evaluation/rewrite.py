"""Offline follow-up rewriting measured against human standalone rewrites.

Accepted files (``kind="auto"`` recognises them from the content):

* ``restoration``: Restoration-200K TSV, 8 tab-separated fields
  ``ctx1 ctx2 ctx3 ctx4 current next_reply label rewrite``; only label-1 items are scored;
* ``su2019``: REWRITE corpus (Su et al. 2019), fields separated by a double tab,
  ``ctx1\\t\\tctx2\\t\\tcurrent\\t\\trewrite``;
* ``canard``: CANARD JSON list of ``{History, Question, Rewrite}``.

Every item is rewritten by `OfflineRewriter` (the rewriter alone: in the engine it
runs only when the detector says a message needs context, and every item here does
need context except CANARD's few unchanged questions). The do-nothing baseline
returns the message unchanged. Figures: ``exact_match`` (0–1), restoration
precision/recall/F for n = 1, 2, 3 (Pan et al. 2019, over jieba words / English
words; ``restoration_f1`` is the unigram F), corpus ``bleu`` (0–100, BLEU-4, Chinese
per character), each with its ``baseline_`` twin, plus ``changed`` (share rewritten).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from ..processors.rewrite import OfflineRewriter
from ..processors.verify import check
from .metrics import bleu, exact_match, normalize_text, restoration_scores, tokenize
from .report import JsonFlag, print_json_line, progress_steps

__all__ = [
    "RewriteItem",
    "detect_rewrite_format",
    "evaluate_rewrite",
    "harm_rate",
    "load_rewrite_items",
    "print_rewrite_table",
    "register",
]

RewriteFormat = Literal["restoration", "su2019", "canard"]


@dataclass(frozen=True, kw_only=True)
class RewriteItem:
    """A context-dependent message, the turns before it and its reference rewrite."""

    message: str
    context: tuple[str, ...]
    """Earlier turn texts, oldest first."""
    reference: str


def detect_rewrite_format(text: str) -> RewriteFormat:
    """Which of the three formats ``text`` (a whole file) is in."""
    if text.lstrip().startswith("["):
        return "canard"
    first = next((line for line in text.splitlines() if line.strip()), "")
    if "\t\t" in first and len(first.split("\t\t")) == 4:
        return "su2019"
    if len(first.split("\t")) >= 7:
        return "restoration"
    raise ValueError("not a Restoration-200K, REWRITE (Su 2019) or CANARD file")


def load_rewrite_items(
    path: str | Path, *, kind: str = "auto", limit: int | None = None, seed: int = 13
) -> tuple[RewriteFormat, list[RewriteItem]]:
    """Items of ``path``; with ``limit``, a random sample of that size (fixed ``seed``)."""
    text = Path(path).read_text(encoding="utf-8-sig")
    fmt: RewriteFormat = detect_rewrite_format(text) if kind == "auto" else kind  # type: ignore[assignment]
    items: list[RewriteItem] = []
    if fmt == "canard":
        items = [RewriteItem(message=i["Question"], context=tuple(i.get("History") or ()),
                             reference=i["Rewrite"]) for i in json.loads(text)]
    elif fmt == "su2019":
        for line in text.splitlines():
            fields = line.split("\t\t")
            if len(fields) == 4:
                items.append(RewriteItem(message=fields[2], context=(fields[0], fields[1]),
                                         reference=fields[3]))
    else:
        for line in text.splitlines():
            fields = line.split("\t")
            if len(fields) < 7 or fields[6].strip() not in {"0", "1"}:
                continue
            needs = fields[6].strip() == "1"
            if needs and not (len(fields) >= 8 and fields[7].strip()):
                continue
            # A label-0 item needs no rewrite: its reference is the message itself.
            items.append(RewriteItem(message=fields[4],
                                     context=tuple(f for f in fields[:4] if f.strip()),
                                     reference=fields[7] if needs else fields[4]))
    if limit is not None and limit < len(items):
        items = random.Random(seed).sample(items, limit)
    return fmt, items


def _scores(messages: Sequence[str], outputs: Sequence[str], references: Sequence[str],
            prefix: str = "") -> dict[str, Any]:
    restoration = restoration_scores(messages, outputs, references)
    figures: dict[str, Any] = {
        "exact_match": exact_match(outputs, references),
        "bleu": bleu(outputs, references)["bleu"],
        **restoration,
    }
    return {f"{prefix}{k}": v for k, v in figures.items()}


def evaluate_rewrite(
    path: str | Path,
    *,
    kind: str = "auto",
    limit: int | None = None,
    progress: bool = True,
    rewriter: OfflineRewriter | None = None,
) -> dict[str, Any]:
    """Score the offline rewriter and the do-nothing baseline on ``path``.

    ``limit`` scores a fixed-seed random sample of that many items. Returns
    ``format``, ``n``, ``changed`` and, for the rewriter and ``baseline_``, the figures
    listed in the module docstring.
    """
    fmt, items = load_rewrite_items(path, kind=kind, limit=limit)
    rewriter = rewriter or OfflineRewriter()
    outputs: list[str] = []
    rejected = 0
    with progress_steps(f"rewriting ({fmt})", len(items), progress) as step:
        for item in items:
            # The shipped path: the rewriter's output counts only once the verifier accepts it.
            used, refused = check(item.message, rewriter.rewrite_texts(item.message, item.context),
                                  item.context)
            rejected += refused is not None
            outputs.append(used.text)
            step()
    messages = [i.message for i in items]
    references = [i.reference for i in items]
    n = max(1, len(items))
    changed = [o.strip() != m.strip() for o, m in zip(outputs, messages, strict=True)]
    not_needed = [normalize_text(i.reference) == normalize_text(i.message) for i in items]
    # No shipped model is trained on rewrite data; the detector does not run here (every
    # item goes to the rewriter, a stricter test than the engine, which asks it first).
    result: dict[str, Any] = {"format": fmt, "n": len(items), "n_not_needed": sum(not_needed),
                              "in_sample": False, "pipeline": "offline rewriter + verifier"}
    result["changed"] = round(sum(changed) / n, 4)
    result["changed_when_not_needed"] = round(
        sum(c and nn for c, nn in zip(changed, not_needed, strict=True)) / max(1, sum(not_needed)), 4)
    result["harm_rate"] = harm_rate(messages, outputs, references)
    result["rejected_by_verifier"] = round(rejected / n, 4)
    result.update(_scores(messages, outputs, references))
    result.update(_scores(messages, messages, references, prefix="baseline_"))
    result["baseline_harm_rate"] = 0.0
    return result


def harm_rate(messages: Sequence[str], outputs: Sequence[str], references: Sequence[str]) -> float:
    """Share of items whose output differs from the message and either inserts a word that
    is not in the reference or deletes a message word that is in the reference (eval tokens)."""
    harmed = 0
    for message, output, reference in zip(messages, outputs, references, strict=True):
        if output.strip() == message.strip():
            continue
        before, after, gold = set(tokenize(message)), set(tokenize(output)), set(tokenize(reference))
        if (after - before - gold) or ((before - after) & gold):
            harmed += 1
    return round(harmed / max(1, len(messages)), 4)


def print_rewrite_table(result: dict[str, Any]) -> None:
    """A rich table: offline rewriter vs do-nothing, one row per figure."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"follow-up rewriting ({result['format']}, n={result['n']}, "
                        f"changed={result['changed']:.1%})")
    table.add_column("figure")
    table.add_column("offline rewriter", justify="right")
    table.add_column("do nothing", justify="right")
    for key, value in result.items():
        if key.startswith("baseline_") or key in {"format", "n", "changed", "in_sample", "pipeline"}:
            continue
        baseline = result.get("baseline_" + key)
        table.add_row(key, f"{value:.4g}", "" if baseline is None else f"{baseline:.4g}")
    Console().print(table)


def register(app: typer.Typer) -> None:
    """Add the ``rewrite`` evaluation subcommand to ``app``."""

    @app.command("rewrite")
    def rewrite_command(
        data: Annotated[Path, typer.Option("--data", help="Restoration TSV, Su 2019 or CANARD")],
        kind: Annotated[str, typer.Option(help="auto, restoration, su2019 or canard")] = "auto",
        limit: Annotated[
            int | None, typer.Option(help="Score a fixed-seed random sample of N items")
        ] = None,
        as_json: JsonFlag = False,
    ) -> None:
        """Exact match, restoration P/R/F and BLEU of the offline rewriter vs do-nothing."""
        if kind not in {"auto", "restoration", "su2019", "canard"}:
            raise typer.BadParameter("kind must be auto, restoration, su2019 or canard")
        result = evaluate_rewrite(data, kind=kind, limit=limit)
        print_rewrite_table(result)
        if as_json:
            print_json_line(result)
