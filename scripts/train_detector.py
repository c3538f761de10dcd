"""Train the offline context-dependence detector shipped in contextmode/processors/data.

    pip install -e '.[train]'
    python scripts/train_detector.py \
        --restoration ../shared/data/restoration200k/valid.txt \
        --canard ../shared/data/canard/dev.json

1. Every item becomes hashed feature slots (`contextmode.processors.detect.context_features`,
   the same function the detector runs).
2. k-fold cross-validation, grouped by dialogue and stratified by label: a logistic
   regression is fitted on the other folds and the full `OfflineContextDetector`
   (model + seed 000 intents) scores the held-out fold. These out-of-fold predictions
   give the reported figures; no item is scored by a model that saw it.
3. A final model is fitted on everything and written as compact JSON.

scikit-learn and numpy are needed here only (the ``train`` extra); the detector itself
runs in pure Python.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
from scipy.sparse import csr_matrix
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedGroupKFold

from contextmode.evaluation.followup import (
    DetectionItem,
    baseline_predictions,
    load_detection_items,
)
from contextmode.evaluation.metrics import binary_scores
from contextmode.processors.detect import (
    DEFAULT_MODEL_FILE,
    DetectorModel,
    OfflineContextDetector,
    context_features,
    feature_slots,
    strong_cue,
    sure_of,
)

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "src" / "contextmode" / "processors" / "data" / DEFAULT_MODEL_FILE
HEADLINE = ("accuracy", "precision", "recall", "f1", "macro_f1")


def _matrix(items: list[DetectionItem], buckets: int) -> csr_matrix:
    indices: list[int] = []
    pointers = [0]
    for item in items:
        indices.extend(feature_slots(context_features(item.message, item.context), buckets))
        pointers.append(len(indices))
    data = np.ones(len(indices), dtype=np.float64)
    return csr_matrix((data, indices, pointers), shape=(len(items), buckets))


def _weights(labels: np.ndarray, sources: np.ndarray) -> np.ndarray:
    """Balance the classes within each source, and give each source equal total weight."""
    weights = np.zeros(len(labels))
    for source in np.unique(sources):
        in_source = sources == source
        for label in (0, 1):
            mask = in_source & (labels == label)
            if mask.any():
                weights[mask] = in_source.sum() / (2 * mask.sum())
    return weights * len(labels) / weights.sum()


def _fit(x: csr_matrix, y: np.ndarray, w: np.ndarray, c: float, buckets: int,
         info: dict[str, Any] | None = None) -> DetectorModel:
    model = LogisticRegression(C=c, max_iter=5000)
    model.fit(x, y, sample_weight=w)
    coef = model.coef_[0]
    nonzero = np.flatnonzero(np.abs(coef) > 1e-4)
    return DetectorModel(
        buckets=buckets,
        weights={int(i): float(coef[i]) for i in nonzero},
        intercept=float(model.intercept_[0]),
        threshold=0.5,
        info=info,
    )


def _figures(gold: list[bool], predicted: list[bool]) -> dict[str, float]:
    scores = binary_scores(gold, predicted)
    return {k: scores[k] for k in HEADLINE}


def _bands(spec: str, datasets: dict[str, list[DetectionItem]], sources: np.ndarray, predicted: np.ndarray,
           probability: np.ndarray, template: np.ndarray, cue: np.ndarray) -> dict[str, Any]:
    """Out-of-fold figures inside and outside each probability band (``low-high``), as
    `OfflineContextDetector` tells them apart (`Detection.sure`): a message is sure outside the
    band (a probability at ``high`` and above, or below ``low`` with no follow-up cue) or when
    a template intent ("give me an example") decided it; the others are where a cascade asks a
    model."""
    out: dict[str, Any] = {}
    for band in spec.split(","):
        low, high = (float(x) for x in band.split("-"))
        entry: dict[str, Any] = {}
        for name, rows in datasets.items():
            mask = sources == name
            gold = np.array([item.needs_context for item in rows])
            pred, prob, tmpl, cued = predicted[mask], probability[mask], template[mask], cue[mask]
            decided = np.array([sure_of(float(p), cued=bool(c), unsure=(low, high))
                                for p, c in zip(prob, cued, strict=True)], dtype=bool)
            unsure = ~tmpl & ~decided
            entry[name] = {"n": len(rows), "in_band": int(unsure.sum()),
                           "in_band_share": round(float(unsure.mean()), 3)}
            for part, sel in (("inside", unsure), ("outside", ~unsure)):
                if sel.any():
                    entry[name][part] = _figures(list(gold[sel]), list(pred[sel]))
        out[band] = entry
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--restoration", type=Path, required=True,
                        help="Restoration-200K TSV (8 fields, label in field 7)")
    parser.add_argument("--canard", type=Path, help="CANARD JSON (English signal)")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--c", type=float, default=0.5, help="inverse L2 strength")
    parser.add_argument("--buckets", type=int, default=1 << 18)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--no-save", action="store_true", help="only cross-validate")
    parser.add_argument("--bands", default="", help="probability bands to report, e.g. 0.3-0.7,0.2-0.8: "
                        "the out-of-fold figures inside and outside each (where a cascade asks a model)")
    args = parser.parse_args(argv)

    started = time.time()
    datasets = {"restoration200k": load_detection_items(args.restoration)}
    if args.canard:
        datasets["canard"] = load_detection_items(args.canard)
    items = [item for rows in datasets.values() for item in rows]
    sources = np.array([name for name, rows in datasets.items() for _ in rows])
    # One group per dialogue, so turns of one conversation never straddle train and test.
    groups = np.array([
        f"dialogue:{zlib.crc32(chr(31).join(item.context[:2]).encode())}"
        if name == "canard" else f"item:{i}"
        for i, (name, item) in enumerate(zip(sources, items, strict=True))
    ])
    y = np.array([int(item.needs_context) for item in items])
    x = _matrix(items, args.buckets)
    w = _weights(y, sources)
    print(f"{len(items)} items, features built in {time.time() - started:.0f}s", file=sys.stderr)

    predicted = np.zeros(len(items), dtype=bool)
    probability = np.zeros(len(items))
    template = np.zeros(len(items), dtype=bool)
    cue = np.array([strong_cue(item.message) is not None for item in items])
    splitter = StratifiedGroupKFold(args.folds, shuffle=True, random_state=args.seed)
    strata = np.array([f"{s}:{label}" for s, label in zip(sources, y, strict=True)])
    fold_scores: dict[str, list[float]] = {name: [] for name in datasets}
    for k, (train, test) in enumerate(splitter.split(x, strata, groups)):
        model = _fit(x[train], y[train], w[train], args.c, args.buckets)
        detector = OfflineContextDetector(model)
        for i in test:
            detection = detector.detect_texts(items[i].message, items[i].context)
            predicted[i] = detection.needs_context
            probability[i] = model.probability(items[i].message, items[i].context)
            template[i] = detection.intent not in (None, "pronoun")
        for name in datasets:
            mask = test[sources[test] == name]
            fold_scores[name].append(
                binary_scores(list(y[mask].astype(bool)), list(predicted[mask]))["macro_f1"])
        print(f"fold {k + 1}/{args.folds} done", file=sys.stderr)

    report: dict[str, Any] = {"folds": args.folds, "seed": args.seed, "c": args.c,
                              "buckets": args.buckets}
    for name, rows in datasets.items():
        mask = sources == name
        gold = [item.needs_context for item in rows]
        entry: dict[str, Any] = {"n": len(rows), "positives": sum(gold),
                                 "cv": _figures(gold, list(predicted[mask]))}
        entry["cv_macro_f1_per_fold"] = [round(s, 4) for s in fold_scores[name]]
        entry["baselines"] = {b: _figures(gold, p)
                              for b, p in baseline_predictions(rows).items()}
        report[name] = entry

    if args.bands:
        report["bands"] = _bands(args.bands, datasets, sources, predicted, probability, template, cue)

    if not args.no_save:
        final = _fit(x, y, w, args.c, args.buckets, info={
            "trained_on": sorted(datasets),
            "items": len(items),
            "cross_validation": {n: report[n]["cv"] for n in datasets},
            "script": "scripts/train_detector.py",
        })
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(final.to_json()) + "\n", encoding="utf-8")
        report["saved"] = str(args.out)
        report["nonzero_weights"] = len(final.weights)
        report["model_bytes"] = args.out.stat().st_size
    report["seconds"] = round(time.time() - started, 1)
    print(json.dumps(report, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
