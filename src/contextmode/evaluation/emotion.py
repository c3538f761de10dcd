"""Emotion intensity against CPED (Chinese) and ESConv (English), and key moments vs random.

CPED (``valid_split.csv``: one utterance a row, ``Emotion`` labels): how well the score
separates neutral from emotional utterances (ROC AUC), and strongly emotional ones
(`STRONG_LABELS`) from the rest; each utterance is scored after the turns before it in
its dialogue, as the engine does. ESConv (``valid.jsonl``): Spearman correlation between
the scores of the seeker's first turns (mean and max) and the seeker's self-reported
initial intensity (1–5), and the end-to-end key-moment check (`key_moments_vs_random`).
Baselines are scored the same way: utterance length and an exclamation-mark count.

The shipped scorer is what is measured. Its model records content hashes of the files
and dialogues it was fitted on; a file that is (part of) them is reported with
``in_sample: true``. ``cv=K`` instead reports grouped K-fold held-out figures of the
training recipe on the file (needs the ``train`` extra).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import typer

from ..processors.base import PriorTurn
from ..processors.emotion import analyze_emotion, analyze_lexicon
from ..processors.emotion_model import CONTEXT_WINDOW, KEY_MOMENT_THRESHOLD, load_emotion_model
from .emotion_data import (
    Conversation,
    Utterance,
    cped_dialogue_hashes,
    detect_format,
    dialogue_hash,
    file_sha256,
    read_cped,
    read_esconv,
)
from .metrics import balanced_accuracy, roc_auc, spearman
from .report import JsonFlag, print_figures, print_json_line, progress_steps

__all__ = ["KEY_MOMENT_THRESHOLD", "evaluate_emotion", "in_sample", "key_moments_vs_random",
           "register"]


def _exclaims(text: str) -> float:
    return float(text.count("!") + text.count("！"))


def _length(text: str) -> float:
    return float(len(text))


def in_sample(path: Path, hashes: Sequence[str]) -> dict[str, Any]:
    """Whether the shipped model was fitted on the file at ``path`` or some of its dialogues.

    ``hashes`` are the file's `dialogue_hash` values. Returns ``in_sample`` and the share
    of the file's dialogues the model was fitted on (1.0 for the very same file).
    """
    model = load_emotion_model()
    training = list((model.info or {}).get("training", [])) if model is not None else []
    sha = file_sha256(path)
    if any(entry.get("sha256") == sha for entry in training):
        return {"in_sample": True, "in_sample_share": 1.0}
    seen = {h for entry in training for h in entry.get("dialogues", [])}
    share = sum(h in seen for h in hashes) / len(hashes) if hashes else 0.0
    return {"in_sample": share > 0, "in_sample_share": round(share, 4)}


def evaluate_emotion(
    path: str | Path,
    *,
    first_turns: int = 3,
    limit: int | None = None,
    show_progress: bool = False,
    use_model: bool = True,
    cv: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Score a CPED CSV or an ESConv JSONL file with the shipped `OfflineEmotionScorer`.

    CPED: ``auc`` (neutral vs emotional), ``auc_strong``, ``balanced_accuracy`` at 0.7
    (strong vs not), ``key_moment_share`` vs ``strong_share`` and the baselines
    ``auc_length`` / ``auc_exclaim``. ESConv: ``spearman`` (mean of the seeker's first
    ``first_turns`` turns), ``spearman_max``, baselines and ``key_moments``. Always
    ``in_sample``. ``cv=K``: grouped K-fold figures of the training recipe instead.
    ``use_model=False`` scores with the lexicon alone.
    """
    data_path = Path(path)
    kind = detect_format(data_path)
    if cv is not None:
        if cv < 2:
            raise ValueError(f"--cv needs at least 2 folds, got {cv}")
        return _cross_validate(data_path, kind, cv, first_turns, limit, seed)
    if kind == "cped":
        return _evaluate_cped(data_path, limit, show_progress, use_model)
    return _evaluate_esconv(data_path, first_turns, limit, show_progress, use_model, seed)


def _cross_validate(path: Path, kind: str, folds: int, first_turns: int, limit: int | None,
                    seed: int) -> dict[str, Any]:
    try:
        from . import emotion_train
    except ImportError as exc:
        raise RuntimeError(f"--cv needs the train extra (pip install 'contextmode[train]'): {exc}"
                           ) from None
    if kind == "cped":
        rows = read_cped(path)[:limit]
        result = emotion_train.cross_validate_cped(rows, folds, seed=seed)
        result.update(dataset="cped", items=len(rows))
    else:
        convs = read_esconv(path)[:limit]
        result = emotion_train.cross_validate_esconv(convs, folds, first_turns=first_turns)
        result.update(dataset="esconv", items=len(convs))
        levels = [c.level for c in convs if c.level is not None and c.seeker_turns]
        joined = [" ".join(c.seeker_turns[:first_turns]) for c in convs
                  if c.level is not None and c.seeker_turns]
        result["spearman_length"] = round(spearman([_length(t) for t in joined], levels), 4)
        result["spearman_exclaim"] = round(spearman([_exclaims(t) for t in joined], levels), 4)
    result.update(mode=f"grouped {folds}-fold cross-validation of the training recipe",
                  in_sample=False)
    return result


def _score_cped(rows: Sequence[Utterance], show_progress: bool, use_model: bool
                ) -> list[float]:
    scores: list[float] = []
    with progress_steps("scoring CPED utterances", len(rows), show_progress) as step:
        for i, row in enumerate(rows):
            if not use_model:
                scores.append(analyze_lexicon(row.text).intensity)
            else:
                prior = [PriorTurn(text=rows[j].text, same_speaker=rows[j].speaker == row.speaker)
                         for j in range(max(0, i - CONTEXT_WINDOW), i)
                         if rows[j].dialogue == row.dialogue]
                scores.append(analyze_emotion(row.text, prior=prior).intensity)
            step()
    return scores


def _evaluate_cped(
    path: Path, limit: int | None, show_progress: bool, use_model: bool
) -> dict[str, Any]:
    rows = read_cped(path)[:limit]
    texts = [r.text for r in rows]
    emotional = [r.emotional for r in rows]
    strong = [r.strong for r in rows]
    scores = _score_cped(rows, show_progress, use_model)
    n = len(rows) or 1
    result: dict[str, Any] = {
        "dataset": "cped",
        "scorer": "shipped" if use_model else "lexicon",
        **in_sample(path, cped_dialogue_hashes(rows)),
        "items": len(rows),
        "emotional_share": round(sum(emotional) / n, 4),
        "strong_share": round(sum(strong) / n, 4),
        "auc": round(roc_auc(scores, emotional), 4),
        "auc_strong": round(roc_auc(scores, strong), 4),
        "balanced_accuracy": round(balanced_accuracy(scores, strong, KEY_MOMENT_THRESHOLD), 4),
        "key_moment_share": round(sum(s > KEY_MOMENT_THRESHOLD for s in scores) / n, 4),
        "mean_score_neutral": _mean([s for s, e in zip(scores, emotional, strict=True) if not e]),
        "mean_score_emotional": _mean([s for s, e in zip(scores, emotional, strict=True) if e]),
        "auc_length": round(roc_auc([_length(t) for t in texts], emotional), 4),
        "auc_exclaim": round(roc_auc([_exclaims(t) for t in texts], emotional), 4),
    }
    return result


def _mean(values: Sequence[float]) -> float:
    return round(sum(values) / len(values), 4) if values else 0.0


def _evaluate_esconv(
    path: Path, first_turns: int, limit: int | None, show_progress: bool, use_model: bool,
    seed: int,
) -> dict[str, Any]:
    convs = read_esconv(path)[:limit]
    items = [c for c in convs if c.level is not None and c.seeker_turns]
    levels = [float(c.level or 0.0) for c in items]
    analyze = analyze_emotion if use_model else analyze_lexicon
    mean_scores: list[float] = []
    max_scores: list[float] = []
    with progress_steps("scoring ESConv seeker turns", len(items), show_progress) as step:
        for conv in items:
            turn_scores = [analyze(t).intensity for t in conv.seeker_turns[:first_turns]]
            mean_scores.append(sum(turn_scores) / len(turn_scores))
            max_scores.append(max(turn_scores))
            step()
    joined = [" ".join(c.seeker_turns[:first_turns]) for c in items]
    result: dict[str, Any] = {
        "dataset": "esconv",
        "scorer": "shipped" if use_model else "lexicon",
        **in_sample(path, [dialogue_hash(c.turns) for c in convs]),
        "items": len(items),
        "first_turns": first_turns,
        "spearman": round(spearman(mean_scores, levels), 4),
        "spearman_max": round(spearman(max_scores, levels), 4),
        "spearman_length": round(spearman([_length(t) for t in joined], levels), 4),
        "spearman_exclaim": round(spearman([_exclaims(t) for t in joined], levels), 4),
        "mean_score": _mean(mean_scores),
    }
    if use_model:
        result["key_moments"] = asyncio.run(key_moments_vs_random(convs, seed=seed))
    return result


def _content_words(text: str) -> set[str]:
    from ..processors.constraints import content_words

    return {w for w in content_words(text) if len(w) >= 3}


def gold_turns(conv: Conversation) -> set[int]:
    """Seeker turns (indexes into ``conv.turns``) that state the problem or the strongest feeling.

    Judged against what the seeker wrote before the chat, not by the scorer: the turn
    sharing the most content words with the ``situation`` the seeker typed (the problem
    statement), and every seeker turn naming their ``emotion_type`` (e.g. "anxiety": anxious).
    """
    situation = _content_words(conv.situation)
    stem = conv.emotion_type.lower()[:5]
    seeker = [(i, text) for i, (speaker, text) in enumerate(conv.turns) if speaker == "usr"]
    gold: set[int] = set()
    overlaps = [(len(_content_words(text) & situation), i) for i, text in seeker]
    best = max(overlaps, default=(0, -1))
    if best[0] >= 2:
        gold.add(best[1])
    if len(stem) >= 4:
        gold.update(i for i, text in seeker if stem in text.lower())
    return gold


async def key_moments_vs_random(
    conversations: Sequence[Conversation], *, seed: int = 0, draws: int = 200
) -> dict[str, Any]:
    """How often the ``hybrid`` strategy's key moments are `gold_turns`, vs random picks.

    Each conversation is replayed through the real `Engine` (in-memory store, offline
    processors, background emotion jobs drained), then the ``hybrid`` plan is made for the
    next message. Random baseline: the same number of turns drawn from the turns the
    key-moment layer could have held (user turns older than the recent window), averaged
    over ``draws`` draws. ``ratio`` = key-moment hit rate / random hit rate.
    """
    from ..api import build_engine
    from ..memory import get_strategy
    from ..types import utc_now

    strategy = get_strategy("hybrid")
    rng = random.Random(seed)
    engine = build_engine(store="memory://", processors="offline")
    picked = hits = 0
    expected = 0.0
    used = 0
    try:
        for n, conv in enumerate(conversations):
            gold = gold_turns(conv)
            if not gold:
                continue
            sid = f"esconv-{n}"
            seq_of: dict[int, int] = {}
            for i, (speaker, text) in enumerate(conv.turns):
                turn = await engine.record("eval", sid, "user" if speaker == "usr" else "assistant",
                                           text)
                seq_of[turn.seq] = i
            await engine.drain()
            state = await engine.load("eval", sid, strategy)
            plan = strategy.plan(state, "", now=utc_now() + timedelta(seconds=1))
            chosen = [seq_of[t.seq] for t in plan.key_moments]
            first_window = min((t.seq for t in plan.recent), default=10**9)
            pool = [i for seq, i in seq_of.items()
                    if conv.turns[i][0] == "usr" and seq < first_window]
            if not chosen or not pool:
                continue
            used += 1
            picked += len(chosen)
            hits += sum(i in gold for i in chosen)
            k = min(len(chosen), len(pool))
            expected += sum(sum(i in gold for i in rng.sample(pool, k)) for _ in range(draws)
                            ) / draws
    finally:
        await engine.close()
    rate = hits / picked if picked else 0.0
    random_rate = expected / picked if picked else 0.0
    return {"conversations": used, "key_moments": picked, "gold_hits": hits,
            "hit_rate": round(rate, 4), "random_hit_rate": round(random_rate, 4),
            "ratio": round(rate / random_rate, 3) if random_rate else None}


def register(app: typer.Typer) -> None:
    """Add the ``emotion`` evaluation subcommand to ``app``."""

    @app.command("emotion")
    def emotion_command(
        data: Annotated[Path, typer.Option("--data", help="CPED .csv or ESConv .jsonl file")],
        first_turns: Annotated[int, typer.Option(help="ESConv: seeker turns scored")] = 3,
        limit: Annotated[int | None, typer.Option(help="Score only the first N items")] = None,
        lexicon_only: Annotated[bool, typer.Option(help="Lexicon alone, no model")] = False,
        cv: Annotated[int | None, typer.Option(
            "--cv", help="Grouped K-fold figures of the training recipe (train extra)")] = None,
        as_json: JsonFlag = False,
    ) -> None:
        """Emotion intensity vs CPED labels or ESConv seeker intensity."""
        try:
            result = evaluate_emotion(data, first_turns=first_turns, limit=limit,
                                      show_progress=cv is None, use_model=not lexicon_only,
                                      cv=cv)
        except (OSError, ValueError, RuntimeError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        print_figures(f"emotion ({result['dataset']})", result)
        if as_json:
            print_json_line(result)
