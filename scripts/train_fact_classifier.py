"""Train the English fact clause scorer (`contextmode.processors.fact_scorer`) on MSC.

Needs the ``train`` extra (scikit-learn). Labels come from Multi-Session Chat persona
annotations: a clause of an utterance is positive when it matches one of the utterance's
gold facts (``persona_text``) under the coverage rule of `contextmode.evaluation.constraints`.
The threshold is the lowest probability at which the scorer alone keeps a precision of at
least ``--target-precision`` in 5-fold cross-validation on the TRAINING files (folds by
dialogue, out-of-fold probabilities, so the threshold is not tuned on memorised clauses);
``--eval`` files are never looked at before the model is written, and are then scored with
the full extractor (typed patterns plus the new scorer) next to the patterns-only one.

    python scripts/train_fact_classifier.py \\
        --train ../shared/data/msc/personasummary_s1_valid.txt ../shared/data/msc/personasummary_s2_valid.txt \\
        --eval ../shared/data/msc/personasummary_s3_valid.txt ../shared/data/msc/personasummary_s4_valid.txt \\
        --out /tmp/fact_scorer_s12.json

The shipped model (``src/contextmode/processors/data/fact_scorer_en.json``) is the same
command with all four dev files as ``--train``. The last line printed is a JSON object.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from contextmode.errors import MissingExtra
from contextmode.evaluation.constraints import evaluate_constraints, facts_cover, read_dialogues
from contextmode.processors.constraints import OfflineConstraintExtractor
from contextmode.processors.fact_scorer import (
    FORMAT,
    Clause,
    FactScorer,
    candidates,
    clause_features,
    fact_words,
)

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "src/contextmode/processors/data/fact_scorer_en.json"


def _gold(persona: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", persona) if fact_words(s)]


def _utterances(paths: list[Path], min_words: int) -> tuple[list[tuple[list[Clause], list[str]]], list[int]]:
    """Candidate clauses and gold facts per utterance, and each clause's dialogue number."""
    out: list[tuple[list[Clause], list[str]]] = []
    groups: list[int] = []
    dialogues = (dialog for path in paths for dialog in read_dialogues(path))
    for number, dialog in enumerate(dialogues):
        for utterance in dialog:
            clauses = candidates(utterance.get("text", ""), min_words)
            out.append((clauses, _gold(utterance.get("persona_text") or "")))
            groups.extend([number] * len(clauses))
    return out, groups


def _pr(data: list[tuple[list[Clause], list[str]]], probs: list[list[float]], k: int,
        threshold: float) -> tuple[float, float]:
    extracted = matched = gold = hit = 0
    for (clauses, golds), p in zip(data, probs, strict=True):
        order = sorted(range(len(clauses)), key=lambda i: -p[i])[:k]
        values = [clauses[i].text for i in order if p[i] >= threshold]
        extracted += len(values)
        gold += len(golds)
        matched += sum(1 for v in values if any(facts_cover(v, g) for g in golds))
        hit += sum(1 for g in golds if any(facts_cover(v, g) for v in values))
    return (matched / extracted if extracted else 0.0), (hit / gold if gold else 0.0)


def train(paths: list[Path], *, c: float, max_facts: int, min_words: int,
          target_precision: float, min_count: int) -> tuple[dict[str, Any], dict[str, Any]]:
    try:
        from sklearn.feature_extraction import DictVectorizer
        from sklearn.linear_model import LogisticRegression
        from sklearn.model_selection import GroupKFold, cross_val_predict
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtra("train", "scikit-learn") from exc
    data, groups = _utterances(paths, min_words)
    rows = [clause_features(cl) for clauses, _ in data for cl in clauses]
    labels = [int(any(facts_cover(cl.text, g) for g in golds)) for clauses, golds in data for cl in clauses]
    counts: dict[str, int] = {}
    for row in rows:
        for name in row:
            counts[name] = counts.get(name, 0) + 1
    rows = [{k: v for k, v in row.items() if counts[k] >= min_count} for row in rows]
    vectorizer = DictVectorizer()
    matrix = vectorizer.fit_transform(rows)
    model = LogisticRegression(C=c, max_iter=3000)
    flat = cross_val_predict(model, matrix, labels, groups=groups, cv=GroupKFold(n_splits=5),
                             method="predict_proba")[:, 1].tolist()
    model.fit(matrix, labels)
    probs, start = [], 0
    for clauses, _ in data:
        probs.append(flat[start:start + len(clauses)])
        start += len(clauses)
    sweep = {}
    for step in range(20, 91, 5):
        t = step / 100
        sweep[t] = _pr(data, probs, max_facts, t)
    passing = [t for t, (p, _) in sweep.items() if p >= target_precision]
    threshold = min(passing) if passing else max(sweep, key=lambda t: sweep[t][0])
    weights = {
        name: round(float(w), 4)
        for name, w in zip(vectorizer.get_feature_names_out(), model.coef_[0], strict=True)
        if abs(w) >= 1e-3
    }
    payload = {
        "format": FORMAT,
        "trained_on": [p.name for p in paths],
        "rule": "coverage 0.5",
        "C": c,
        "threshold": threshold,
        "max_facts": max_facts,
        "min_words": min_words,
        "bias": round(float(model.intercept_[0]), 4),
        "weights": dict(sorted(weights.items())),
    }
    info = {
        "clauses": len(labels),
        "positive_share": round(sum(labels) / len(labels), 4),
        "features": len(weights),
        "threshold": threshold,
        "cv_sweep": {str(t): [round(p, 3), round(r, 3)] for t, (p, r) in sweep.items()},
    }
    return payload, info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", nargs="+", type=Path, required=True)
    parser.add_argument("--eval", nargs="*", type=Path, default=[])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--C", dest="c", type=float, default=0.1)
    parser.add_argument("--max-facts", type=int, default=2)
    parser.add_argument("--min-words", type=int, default=1)
    parser.add_argument("--min-count", type=int, default=3)
    parser.add_argument("--target-precision", type=float, default=0.7)
    args = parser.parse_args()
    payload, info = train(args.train, c=args.c, max_facts=args.max_facts, min_words=args.min_words,
                          target_precision=args.target_precision, min_count=args.min_count)
    args.out.write_text(json.dumps(payload, separators=(",", ":")) + "\n", encoding="utf-8")
    scorer = FactScorer.from_dict(payload)
    report: dict[str, Any] = {"out": str(args.out), **info, "eval": {}}
    for path in args.eval:
        scored = evaluate_constraints(path, extractor=OfflineConstraintExtractor(fact_scorer=scorer))
        patterns = evaluate_constraints(path, extractor=OfflineConstraintExtractor(fact_scorer=False))
        keys = ("precision", "recall", "f1", "strict_precision", "strict_recall", "strict_f1",
                "extracted", "gold_facts")
        report["eval"][path.name] = {
            "model": {k: scored[k] for k in keys},
            "patterns_only": {k: patterns[k] for k in keys},
        }
        print(path.name, report["eval"][path.name])
    print(json.dumps(report))


if __name__ == "__main__":
    main()
