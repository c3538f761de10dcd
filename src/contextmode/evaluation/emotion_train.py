"""The training recipe of the shipped emotion model, and its grouped cross-validation.

Needs the ``train`` extra (scikit-learn, numpy, scipy); the scorer itself runs in pure
Python. `fit_recipe` is what ``scripts/train_emotion.py`` ships; `cross_validate` is what
``contextmode eval emotion --cv K`` reports: the same recipe fitted on K-1 folds and
scored on the held-out one, folds grouped by dialogue so no dialogue is split.

Recipe (see `contextmode.processors.emotion_model`):

1. Stage 1, Chinese text model: logistic regression (balanced classes, L2 strength chosen
   from `C_GRID` by an inner grouped 3-fold) over hashed features of CPED utterances,
   target "any emotion label but neutral".
2. Stage 2, context: a dense logistic regression over `CONTEXT_FEATURES`, fitted on
   out-of-fold stage-1 logits of the training part (so it learns how far to trust a
   logit it has not seen being fitted).
3. Calibration (`calibrate`): Chinese puts the share of training utterances labelled
   strongly emotional (`STRONG_LABELS`) above 0.7 and the share labelled neutral below
   0.3; English (shift only) puts the share of ESConv seekers reporting intensity 5 of 5
   above 0.7 among their turns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.sparse import csr_matrix
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import GroupKFold, StratifiedGroupKFold

from ..processors.emotion import analyze_lexicon, text_logit
from ..processors.emotion_model import (
    CALM_THRESHOLD,
    CONTEXT_WINDOW,
    KEY_MOMENT_THRESHOLD,
    Calibration,
    ContextModel,
    EmotionModel,
    PriorLogit,
    calibrate,
    context_features,
    emotion_features,
    feature_slots,
    with_lexicon_floor,
)
from .emotion_data import STRONG_LEVEL, Conversation, Utterance
from .metrics import spearman

__all__ = ["C_GRID", "ZhFeatures", "cross_validate_cped", "cross_validate_esconv",
           "esconv_scores", "fit_recipe", "score_cped"]

C_GRID = (0.02, 0.05)
BUCKETS = 1 << 16


@dataclass(frozen=True)
class ZhFeatures:
    """CPED utterances as a sparse matrix of stage-1 feature slots, with labels and groups."""

    x: csr_matrix
    y: np.ndarray
    strong: np.ndarray
    groups: np.ndarray
    speakers: np.ndarray
    lexical: np.ndarray

    @classmethod
    def of(cls, rows: Sequence[Utterance], buckets: int = BUCKETS) -> ZhFeatures:
        indices: list[int] = []
        pointers = [0]
        lexical: list[float] = []
        for row in rows:
            analysis = analyze_lexicon(row.text)
            lexical.append(analysis.intensity)
            indices.extend(feature_slots(emotion_features(row.text, analysis), buckets))
            pointers.append(len(indices))
        x = csr_matrix((np.ones(len(indices)), indices, pointers), shape=(len(rows), buckets))
        return cls(
            x=x,
            y=np.array([r.emotional for r in rows], dtype=int),
            strong=np.array([r.strong for r in rows], dtype=bool),
            groups=np.array([r.dialogue for r in rows]),
            speakers=np.array([r.speaker for r in rows]),
            lexical=np.array(lexical),
        )


def _lr(c: float) -> LogisticRegression:
    return LogisticRegression(C=c, max_iter=5000, solver="liblinear", class_weight="balanced")


def _priors(idx: np.ndarray, z: np.ndarray, data: ZhFeatures, window: int = CONTEXT_WINDOW
            ) -> list[list[PriorLogit]]:
    """Earlier turns of the same dialogue (within ``idx``, file order) for each row of ``idx``."""
    out: list[list[PriorLogit]] = []
    for pos, i in enumerate(idx):
        prior: list[PriorLogit] = []
        for j in idx[max(0, pos - window):pos]:
            if data.groups[j] == data.groups[i]:
                prior.append(PriorLogit(logit=float(z[j]),
                                        same_speaker=bool(data.speakers[j] == data.speakers[i])))
        out.append(prior)
    return out


def _oof_logits(data: ZhFeatures, idx: np.ndarray, c: float, seed: int, folds: int = 3
                ) -> np.ndarray:
    z = np.zeros(data.x.shape[0])
    splitter = StratifiedGroupKFold(folds, shuffle=True, random_state=seed + 1)
    for tr, te in splitter.split(data.x[idx], data.y[idx], data.groups[idx]):
        model = _lr(c).fit(data.x[idx[tr]], data.y[idx[tr]])
        z[idx[te]] = model.decision_function(data.x[idx[te]])
    return z


def _choose_c(data: ZhFeatures, idx: np.ndarray, seed: int) -> float:
    best, best_auc = C_GRID[0], -1.0
    for c in C_GRID:
        z = _oof_logits(data, idx, c, seed)
        auc = roc_auc_score(data.y[idx], z[idx])
        if auc > best_auc:
            best, best_auc = c, auc
    return best


def _english_logits(conversations: Sequence[Conversation]) -> list[float]:
    return [text_logit(t) for conv in conversations for t in conv.seeker_turns]


def fit_recipe(
    data: ZhFeatures, idx: np.ndarray, esconv: Sequence[Conversation] = (), *, seed: int = 0,
    info: dict[str, Any] | None = None,
) -> EmotionModel:
    """Fit stages 1–2 and the calibration on rows ``idx`` of ``data`` (and ``esconv``)."""
    c = _choose_c(data, idx, seed)
    oof = _oof_logits(data, idx, c, seed)
    priors = _priors(idx, oof, data)
    features = np.array([context_features(float(oof[i]), p) for i, p in zip(idx, priors,
                                                                           strict=True)])
    stage2 = LogisticRegression(C=1.0, class_weight="balanced", max_iter=2000)
    stage2.fit(features, data.y[idx])
    context = ContextModel(weights=tuple(float(w) for w in stage2.coef_[0]),
                           intercept=float(stage2.intercept_[0]))
    zh_logits = stage2.decision_function(features)
    calibration = {"zh": calibrate(zh_logits.tolist(), float(data.strong[idx].mean()),
                                   neutral_share=float(1.0 - data.y[idx].mean()))}
    leveled = [conv for conv in esconv if conv.level is not None]
    if leveled:
        share = float(np.mean([conv.level is not None and conv.level >= STRONG_LEVEL
                               for conv in leveled]))
        calibration["en"] = calibrate(_english_logits(leveled), share)
    final = _lr(c).fit(data.x[idx], data.y[idx])
    coef = final.coef_[0]
    weights = {int(i): float(coef[i]) for i in np.flatnonzero(np.abs(coef) > 1e-4)}
    meta = {"c": c, **(info or {})}
    return EmotionModel(buckets=data.x.shape[1], weights=weights,
                        intercept=float(final.intercept_[0]), context=context,
                        calibration=calibration,
                        info=meta)


def score_cped(model: EmotionModel, data: ZhFeatures, idx: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
    """(stage-1 logits, calibrated intensities) of rows ``idx``, as the scorer computes them."""
    dense = np.zeros(model.buckets)
    for slot, value in model.weights.items():
        dense[slot] = value
    z = np.zeros(data.x.shape[0])
    z[idx] = data.x[idx] @ dense + model.intercept
    calibration = model.calibration_for("zh")
    scores = np.array([
        with_lexicon_floor(float(data.lexical[i]), calibration(model.context.logit(float(z[i]), p)))
        for i, p in zip(idx, _priors(idx, z, data), strict=True)])
    return z[idx], scores


def _fold_stats(values: Sequence[float]) -> dict[str, Any]:
    return {"per_fold": [round(float(v), 4) for v in values],
            "mean": round(float(np.mean(values)), 4), "min": round(float(np.min(values)), 4)}


def cross_validate_cped(rows: Sequence[Utterance], folds: int, *, seed: int = 0
                        ) -> dict[str, Any]:
    """Grouped ``folds``-fold figures of the recipe on CPED ``rows`` (see module doc)."""
    data = ZhFeatures.of(rows)
    texts = [r.text for r in rows]
    figures: dict[str, list[float]] = {k: [] for k in (
        "auc", "auc_text_only", "auc_strong", "auc_length", "auc_exclaim",
        "key_moment_share", "strong_share", "calm_share", "neutral_share")}
    # Folds by TV series: a series' speakers, scenes and catchphrases recur across its
    # dialogues, so folds grouped by dialogue alone share them and read optimistic.
    series = np.array([r.series or r.dialogue for r in rows])
    grouped_by = "tv series (no series, speaker or dialogue in two folds)"
    if len(set(series.tolist())) < 2:  # one series (a small sample): folds by dialogue
        series, grouped_by = data.groups, "dialogue (one tv series only: its speakers recur across folds)"
    folds = min(folds, len(set(series.tolist())))
    splitter = StratifiedGroupKFold(folds, shuffle=True, random_state=seed)
    for train, test in splitter.split(data.x, data.y, series):
        train, test = np.sort(train), np.sort(test)
        model = fit_recipe(data, train, seed=seed)
        z, scores = score_cped(model, data, test)
        gold = data.y[test]
        figures["auc"].append(roc_auc_score(gold, scores))
        figures["auc_text_only"].append(roc_auc_score(gold, z))
        figures["auc_strong"].append(roc_auc_score(data.strong[test], scores))
        figures["auc_length"].append(roc_auc_score(gold, [len(texts[i]) for i in test]))
        figures["auc_exclaim"].append(roc_auc_score(
            gold, [texts[i].count("!") + texts[i].count("！") for i in test]))
        figures["key_moment_share"].append(float((scores > KEY_MOMENT_THRESHOLD).mean()))
        figures["strong_share"].append(float(data.strong[test].mean()))
        figures["calm_share"].append(float((scores < CALM_THRESHOLD).mean()))
        figures["neutral_share"].append(float(1.0 - gold.mean()))

    return {"folds": folds, "grouped_by": grouped_by, "groups": len(set(series.tolist())), "seed": seed,
            "held_out": {k: _fold_stats(v) for k, v in figures.items()}}


def esconv_scores(conversations: Sequence[Conversation], calibration: Calibration,
                  first_turns: int
                  ) -> list[float]:
    """Mean calibrated intensity of each conversation's first ``first_turns`` seeker turns."""
    out = []
    for conv in conversations:
        turns = conv.seeker_turns[:first_turns] or [""]
        out.append(float(np.mean([calibration(text_logit(t)) for t in turns])))
    return out


def cross_validate_esconv(conversations: Sequence[Conversation], folds: int, *,
                          first_turns: int = 3) -> dict[str, Any]:
    """Grouped ``folds``-fold Spearman of the recipe on ESConv (English: calibration only)."""
    items = [c for c in conversations if c.level is not None and c.seeker_turns]
    pooled = np.zeros(len(items))
    shifts: list[float] = []
    per_fold: list[float] = []
    levels = np.array([c.level for c in items], dtype=float)
    for train, test in GroupKFold(folds).split(items, groups=list(range(len(items)))):
        train_items = [items[i] for i in train]
        share = float(np.mean([c.level is not None and c.level >= STRONG_LEVEL
                               for c in train_items]))
        calibration = calibrate(_english_logits(train_items), share)
        shifts.append(round(calibration.shift, 4))
        scores = esconv_scores([items[i] for i in test], calibration, first_turns)
        pooled[test] = scores
        per_fold.append(spearman(scores, levels[test].tolist()))
    return {"folds": folds, "grouped_by": "conversation (one seeker each: no seeker in two folds)",
            "first_turns": first_turns,
            "learned": "calibration shift only (no English turn labels)",
            "held_out": {"spearman_pooled": round(spearman(pooled.tolist(), levels.tolist()), 4),
                         "spearman": _fold_stats(per_fold)},
            "shift_per_fold": shifts}
