"""Train the Chinese emotion model shipped in contextmode/processors/data (seed 001).

    pip install -e '.[train]'
    python scripts/train_emotion.py --cped ../shared/data/cped/valid_split.csv

1. Every CPED utterance is scored by the lexicon (`analyze_lexicon`) and turned into
   hashed feature slots (`contextmode.processors.emotion_model.emotion_features`, the
   same function the scorer runs). Target: emotion label other than ``neutral``.
2. Grouped k-fold by ``Dialogue_ID`` (stratified by label): the lines of one dialogue
   are never split between training and scoring. Inside each outer fold the L2
   strength C is chosen from a fixed grid by an inner grouped k-fold on the training
   part only (nested), then the model is refitted there and the full
   `analyze_emotion` path (lexicon + model) scores the held-out fold. Reported: per
   fold and mean/min AUC (neutral vs emotional) of the model probability and of the
   shipped intensity, macro-F1 of the probability at 0.5, the lexicon-only and length
   baselines, and the share of turns above seed 001's 0.7 per emotion label.
3. A final model is fitted on all of CPED dev with C chosen by grouped CV on all of
   it, and written as compact JSON.

scikit-learn, numpy and scipy are needed here only (the ``train`` extra); the scorer
itself runs in pure Python.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from scipy.sparse import csr_matrix
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import f1_score, roc_auc_score
from sklearn.model_selection import StratifiedGroupKFold

from contextmode.processors.emotion import EmotionAnalysis, analyze_lexicon
from contextmode.processors.emotion_model import (
    DEFAULT_MODEL_FILE,
    EmotionModel,
    combine,
    emotion_features,
    feature_slots,
)

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "src" / "contextmode" / "processors" / "data" / DEFAULT_MODEL_FILE
C_GRID = (0.01, 0.02, 0.05, 0.1)
KEY_MOMENT = 0.7


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8-sig", newline="") as fh:
        return list(csv.DictReader(fh))


def _matrix(texts: list[str], lex: list[EmotionAnalysis], buckets: int) -> csr_matrix:
    indices: list[int] = []
    pointers = [0]
    for text, analysis in zip(texts, lex, strict=True):
        indices.extend(feature_slots(emotion_features(text, analysis), buckets))
        pointers.append(len(indices))
    data = np.ones(len(indices), dtype=np.float64)
    return csr_matrix((data, indices, pointers), shape=(len(texts), buckets))


def _fit(x: csr_matrix, y: np.ndarray, c: float, buckets: int,
         info: dict[str, Any] | None = None) -> EmotionModel:
    model = LogisticRegression(C=c, max_iter=5000, solver="liblinear",
                               class_weight="balanced")
    model.fit(x, y)
    coef = model.coef_[0]
    nonzero = np.flatnonzero(np.abs(coef) > 1e-4)
    return EmotionModel(buckets=buckets, weights={int(i): float(coef[i]) for i in nonzero},
                        intercept=float(model.intercept_[0]), info=info)


def _choose_c(x: csr_matrix, y: np.ndarray, groups: np.ndarray, folds: int,
              seed: int, buckets: int) -> tuple[float, dict[float, float]]:
    """C of the grid with the best mean grouped-CV AUC on (x, y) alone."""
    means: dict[float, float] = {}
    splitter = StratifiedGroupKFold(folds, shuffle=True, random_state=seed)
    splits = list(splitter.split(x, y, groups))
    for c in C_GRID:
        aucs = []
        for train, test in splits:
            model = _fit(x[train], y[train], c, buckets)
            z = x[test] @ _dense_weights(model) + model.intercept
            aucs.append(roc_auc_score(y[test], z))
        means[c] = round(float(np.mean(aucs)), 4)
    return max(means, key=lambda c: means[c]), means


def _dense_weights(model: EmotionModel) -> np.ndarray:
    w = np.zeros(model.buckets)
    for slot, value in model.weights.items():
        w[slot] = value
    return w


def _share_above(scores: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    return {
        str(label): round(float((scores[labels == label] > KEY_MOMENT).mean()), 4)
        for label in sorted(set(labels.tolist()), key=lambda lb: -(labels == lb).sum())
    }


def _stats(values: list[float]) -> dict[str, Any]:
    return {"per_fold": [round(v, 4) for v in values], "mean": round(float(np.mean(values)), 4),
            "min": round(float(np.min(values)), 4)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cped", type=Path, required=True, help="CPED valid_split.csv")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--inner-folds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--buckets", type=int, default=1 << 16)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--no-save", action="store_true", help="only cross-validate")
    parser.add_argument("--group-by", default="Dialogue_ID",
                        help="CPED column the folds are grouped by (TV_ID: unseen shows)")
    parser.add_argument("--dump", type=Path, help="write out-of-fold scores here (.npz)")
    args = parser.parse_args(argv)

    started = time.time()
    rows = [r for r in _read(args.cped) if r["Utterance"].strip()]
    texts = [r["Utterance"] for r in rows]
    labels = np.array([r["Emotion"] for r in rows])
    groups = np.array([r[args.group_by] for r in rows])
    y = (labels != "neutral").astype(int)
    lex = [analyze_lexicon(t) for t in texts]
    lex_scores = np.array([a.intensity for a in lex])
    x = _matrix(texts, lex, args.buckets)
    print(f"{len(texts)} utterances, features in {time.time() - started:.0f}s", file=sys.stderr)

    prob = np.zeros(len(texts))
    shipped = np.zeros(len(texts))
    figures: dict[str, list[float]] = defaultdict(list)
    chosen: list[float] = []
    fold_of = [0] * len(texts)
    splitter = StratifiedGroupKFold(args.folds, shuffle=True, random_state=args.seed)
    for k, (train, test) in enumerate(splitter.split(x, y, groups)):
        c, _ = _choose_c(x[train], y[train], groups[train], args.inner_folds, args.seed,
                         args.buckets)
        chosen.append(c)
        model = _fit(x[train], y[train], c, args.buckets)
        for i in test:
            fold_of[i] = k
            prob[i] = model.probability(texts[i], lex[i])
            shipped[i] = combine(float(lex_scores[i]), float(prob[i]))
        gold = y[test]
        figures["auc_model"].append(roc_auc_score(gold, prob[test]))
        figures["auc_shipped"].append(roc_auc_score(gold, shipped[test]))
        figures["auc_lexicon"].append(roc_auc_score(gold, lex_scores[test]))
        figures["auc_length"].append(
            roc_auc_score(gold, [len(texts[i].replace(" ", "")) for i in test]))
        figures["macro_f1_model_at_0.5"].append(
            f1_score(gold, prob[test] >= 0.5, average="macro"))
        figures["macro_f1_shipped_at_0.5"].append(
            f1_score(gold, shipped[test] >= 0.5, average="macro"))
        figures["macro_f1_lexicon_at_0.5"].append(
            f1_score(gold, lex_scores[test] >= 0.5, average="macro"))
        print(f"fold {k + 1}/{args.folds}: C={c} auc {figures['auc_shipped'][-1]:.4f}",
              file=sys.stderr)

    if args.dump:
        np.savez(args.dump, prob=prob, lex=lex_scores, labels=labels, y=y,
                 fold=np.array(fold_of))
    report: dict[str, Any] = {
        "utterances": len(texts), "grouped_by": args.group_by,
        "groups": len(set(groups.tolist())),
        "emotional_share": round(float(y.mean()), 4), "folds": args.folds,
        "seed": args.seed, "buckets": args.buckets, "c_chosen_per_fold": chosen,
        "held_out": {name: _stats(values) for name, values in figures.items()},
        "key_moment_share": {
            "shipped": round(float((shipped > KEY_MOMENT).mean()), 4),
            "lexicon": round(float((lex_scores > KEY_MOMENT).mean()), 4),
        },
        "key_moment_share_by_label": {
            "shipped": _share_above(shipped, labels),
            "lexicon": _share_above(lex_scores, labels),
        },
        "mean_shipped_by_label": {
            str(lb): round(float(shipped[labels == lb].mean()), 4)
            for lb in sorted(set(labels.tolist()))
        },
    }
    if not args.no_save:
        c, grid = _choose_c(x, y, groups, args.folds, args.seed, args.buckets)
        final = _fit(x, y, c, args.buckets, info={
            "trained_on": "CPED valid_split.csv (all dialogues)",
            "utterances": len(texts), "c": c, "c_grid_cv_auc": {str(k): v for k, v in grid.items()},
            "held_out_auc": report["held_out"]["auc_shipped"],
            "script": "scripts/train_emotion.py",
        })
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(final.to_json()) + "\n", encoding="utf-8")
        report.update(saved=str(args.out), c_final=c, c_grid_cv_auc=grid,
                      nonzero_weights=len(final.weights), model_bytes=args.out.stat().st_size)
    report["seconds"] = round(time.time() - started, 1)
    print(json.dumps(report, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
