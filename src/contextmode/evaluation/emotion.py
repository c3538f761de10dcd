"""Emotion intensity against CPED (Chinese) and ESConv (English).

CPED (``valid_split.csv``: one utterance a row, ``Emotion`` / ``Sentiment`` labels): how well
the score separates neutral from emotional utterances (ROC AUC, balanced accuracy at the
key-moment threshold, point-biserial correlation). ESConv (``valid.jsonl``): Spearman
correlation between the scores of the seeker's first turns (mean and max) and the seeker's
self-reported initial emotion intensity (1–5). Baselines are scored the same way: utterance
length and an exclamation-mark count.

The shipped Chinese model (``processors/data/emotion_zh.json``) was trained on all of
CPED dev, so its CPED figures here are in-sample; the held-out (grouped k-fold) figures
come from ``scripts/train_emotion.py``. ``use_model=False`` (``--lexicon-only``) scores
with the lexicon alone.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from ..processors.emotion import analyze_emotion, analyze_lexicon
from .metrics import balanced_accuracy, pearson, roc_auc, spearman
from .report import JsonFlag, print_figures, print_json_line, progress_steps

__all__ = ["evaluate_emotion", "register"]

KEY_MOMENT_THRESHOLD = 0.7
"""Seed 001: a turn is a key moment above this intensity."""
EMOTIONAL_THRESHOLD = 0.3
"""Fixed (not tuned) cut for "emotional vs neutral" accuracy: level 2 of 5 and above."""


def _exclaims(text: str) -> float:
    return float(text.count("!") + text.count("！"))


def _length(text: str) -> float:
    return float(len(text))


def _read_cped(path: Path) -> list[tuple[str, str]]:
    with path.open(encoding="utf-8-sig", newline="") as fh:
        return [(row["Utterance"], row["Emotion"]) for row in csv.DictReader(fh)]


def _read_esconv(path: Path, first_turns: int) -> list[tuple[list[str], float]]:
    items = []
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            obj = json.loads(line)
            seeker = [t["text"] for t in obj["dialog"] if t.get("speaker") == "usr"]
            level = obj["survey_score"]["seeker"]["initial_emotion_intensity"]
            if seeker and level not in (None, ""):
                items.append((seeker[:first_turns], float(level)))
    return items


def _detect_format(path: Path) -> str:
    if path.suffix.lower() == ".csv":
        return "cped"
    return "esconv"


def evaluate_emotion(
    path: str | Path,
    *,
    first_turns: int = 3,
    limit: int | None = None,
    show_progress: bool = False,
    use_model: bool = True,
) -> dict[str, Any]:
    """Score a CPED CSV or an ESConv JSONL file with `OfflineEmotionScorer`.

    Returns headline figures: for CPED ``auc`` (neutral vs emotional), ``balanced_accuracy``
    at 0.3, ``pearson`` (point-biserial), ``key_moment_share`` and the baselines'
    ``auc_length`` / ``auc_exclaim``; for ESConv ``spearman`` (mean of the seeker's first
    ``first_turns`` turns), ``spearman_max`` and the baselines. ``use_model=False``
    scores with the lexicon alone (the Chinese model is in-sample on CPED dev).
    """
    data_path = Path(path)
    kind = _detect_format(data_path)
    if kind == "cped":
        return _evaluate_cped(data_path, limit, show_progress, use_model)
    return _evaluate_esconv(data_path, first_turns, limit, show_progress, use_model)


def _score_all(
    texts: Sequence[str], show_progress: bool, label: str, use_model: bool = True
) -> list[float]:
    analyze = analyze_emotion if use_model else analyze_lexicon
    scores: list[float] = []
    with progress_steps(label, len(texts), show_progress) as step:
        for text in texts:
            scores.append(analyze(text).intensity)
            step()
    return scores


def _evaluate_cped(
    path: Path, limit: int | None, show_progress: bool, use_model: bool
) -> dict[str, Any]:
    rows = _read_cped(path)[:limit]
    texts = [text for text, _ in rows]
    emotional = [label != "neutral" for _, label in rows]
    scores = _score_all(texts, show_progress, "scoring CPED utterances", use_model)
    baseline: dict[str, Callable[[str], float]] = {"length": _length, "exclaim": _exclaims}
    result: dict[str, Any] = {
        "dataset": "cped",
        "scorer": "lexicon+model" if use_model else "lexicon",
        "items": len(rows),
        "emotional_share": round(sum(emotional) / len(rows), 4) if rows else 0.0,
        "auc": round(roc_auc(scores, emotional), 4),
        "balanced_accuracy": round(balanced_accuracy(scores, emotional, EMOTIONAL_THRESHOLD), 4),
        "pearson": round(pearson(scores, [float(e) for e in emotional]), 4),
        "key_moment_share": round(
            sum(s > KEY_MOMENT_THRESHOLD for s in scores) / len(scores), 4
        ) if scores else 0.0,
        "mean_score_neutral": _mean([s for s, e in zip(scores, emotional, strict=True) if not e]),
        "mean_score_emotional": _mean([s for s, e in zip(scores, emotional, strict=True) if e]),
    }
    for name, fn in baseline.items():
        result[f"auc_{name}"] = round(roc_auc([fn(t) for t in texts], emotional), 4)
    return result


def _mean(values: Sequence[float]) -> float:
    return round(sum(values) / len(values), 4) if values else 0.0


def _evaluate_esconv(
    path: Path, first_turns: int, limit: int | None, show_progress: bool, use_model: bool
) -> dict[str, Any]:
    items = _read_esconv(path, first_turns)[:limit]
    levels = [level for _, level in items]
    mean_scores: list[float] = []
    max_scores: list[float] = []
    flat = [text for turns, _ in items for text in turns]
    scores = iter(_score_all(flat, show_progress, "scoring ESConv seeker turns", use_model))
    for turns, _ in items:
        turn_scores = [next(scores) for _ in turns]
        mean_scores.append(sum(turn_scores) / len(turn_scores))
        max_scores.append(max(turn_scores))
    joined = [" ".join(turns) for turns, _ in items]
    return {
        "dataset": "esconv",
        "items": len(items),
        "first_turns": first_turns,
        "spearman": round(spearman(mean_scores, levels), 4),
        "spearman_max": round(spearman(max_scores, levels), 4),
        "spearman_length": round(spearman([_length(t) for t in joined], levels), 4),
        "spearman_exclaim": round(spearman([_exclaims(t) for t in joined], levels), 4),
        "mean_score": _mean(mean_scores),
    }


def register(app: typer.Typer) -> None:
    """Add the ``emotion`` evaluation subcommand to ``app``."""

    @app.command("emotion")
    def emotion_command(
        data: Annotated[Path, typer.Option("--data", help="CPED .csv or ESConv .jsonl file")],
        first_turns: Annotated[int, typer.Option(help="ESConv: seeker turns scored")] = 3,
        limit: Annotated[int | None, typer.Option(help="Score only the first N items")] = None,
        lexicon_only: Annotated[
            bool, typer.Option(help="Lexicon alone (the zh model is in-sample on CPED dev)")
        ] = False,
        as_json: JsonFlag = False,
    ) -> None:
        """Emotion intensity vs CPED labels or ESConv seeker intensity."""
        result = evaluate_emotion(data, first_turns=first_turns, limit=limit,
                                  show_progress=True, use_model=not lexicon_only)
        print_figures(f"emotion ({result['dataset']})", result)
        if as_json:
            print_json_line(result)
