"""Measure the estimator against the exact tokenizers on the evaluation datasets.

    python -m contextmode.tokens.evaluate ../shared/data          # markdown table
    python -m contextmode.tokens.evaluate ../shared/data --fit    # refit coefficients

Texts are the utterances of each dataset, de-duplicated. A stable hash splits them
in halves: coefficients are fitted on the even half, errors reported on the odd
half. Error per text is ``(estimate - exact) / exact``; the table gives its mean
absolute value (MAPE) and its mean (bias: negative means under-counting).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, fields
from pathlib import Path

from .base import TokenCounter
from .estimate import FITTED, FIXED_WEIGHTS, EstimateCoefficients, EstimateCounter, script_counts
from .registry import EXACT_ENCODINGS, counter_for_encoding

__all__ = ["fit_coefficients", "load_texts", "main"]


def _restoration(data: Path) -> Iterator[str]:
    with open(data / "restoration200k" / "valid.txt", encoding="utf-8") as fh:
        for line in fh:
            yield from line.rstrip("\n").split("\t")[:6]  # context, current, reply


def _rewrite(data: Path) -> Iterator[str]:
    with open(data / "rewrite_su2019" / "train18k.txt", encoding="utf-8") as fh:
        for line in fh:
            yield from line.rstrip("\n").split("\t\t")[:3]  # context and current


def _cped(data: Path) -> Iterator[str]:
    with open(data / "cped" / "valid_split.csv", encoding="utf-8-sig", newline="") as fh:
        for row in csv.DictReader(fh):
            yield row["Utterance"]


def _canard(data: Path) -> Iterator[str]:
    for item in json.loads((data / "canard" / "dev.json").read_text(encoding="utf-8")):
        yield from item["History"]
        yield item["Question"]


def _esconv(data: Path) -> Iterator[str]:
    with open(data / "esconv" / "valid.jsonl", encoding="utf-8") as fh:
        for line in fh:
            yield from (turn["text"] for turn in json.loads(line)["dialog"])


def _locomo(data: Path) -> Iterator[str]:
    for sample in json.loads((data / "locomo" / "locomo_dev.json").read_text(encoding="utf-8")):
        for key, session in sample["conversation"].items():
            if key.startswith("session_") and isinstance(session, list):
                yield from (turn["text"] for turn in session)


def _msc(data: Path) -> Iterator[str]:
    for path in sorted((data / "msc").glob("personasummary_s*_valid.txt")):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                yield from (turn["text"] for turn in json.loads(line)["dialog"])


DATASETS: dict[str, tuple[str, Callable[[Path], Iterator[str]]]] = {
    "restoration200k": ("zh", _restoration),
    "rewrite_su2019": ("zh", _rewrite),
    "cped": ("zh", _cped),
    "canard": ("en", _canard),
    "esconv": ("en", _esconv),
    "locomo": ("en", _locomo),
    "msc": ("en", _msc),
}


def load_texts(data: Path) -> dict[str, list[str]]:
    """Non-empty, de-duplicated utterances of each dataset found under ``data``."""
    out: dict[str, list[str]] = {}
    for name, (_, reader) in DATASETS.items():
        try:
            texts = dict.fromkeys(t.strip() for t in reader(data))
        except FileNotFoundError:
            print(f"skipping {name}: not found under {data}", file=sys.stderr)
            continue
        out[name] = [t for t in texts if t]
    return out


def _is_fit_half(text: str) -> bool:
    return zlib.crc32(text.encode("utf-8")) % 2 == 0


def _solve(matrix: list[list[float]], vector: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting; the system is small (8x8)."""
    n = len(vector)
    a = [[*row, vector[i]] for i, row in enumerate(matrix)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        a[col], a[pivot] = a[pivot], a[col]
        if abs(a[col][col]) < 1e-12:
            continue  # a feature absent from the data: its weight stays 0
        for r in range(n):
            if r != col:
                factor = a[r][col] / a[col][col]
                a[r] = [x - factor * y for x, y in zip(a[r], a[col], strict=True)]
    return [a[i][n] / a[i][i] if abs(a[i][i]) >= 1e-12 else 0.0 for i in range(n)]


def fit_coefficients(texts: Sequence[str], exact: Sequence[int]) -> EstimateCoefficients:
    """Weighted least squares of exact counts on script counts (fixed weights held).

    Each text is weighted by ``1/sqrt(exact)``: between fitting totals (long texts
    dominate) and fitting relative error (one-token texts dominate).
    """
    k = len(FITTED)
    xtx = [[0.0] * k for _ in range(k)]
    xty = [0.0] * k
    for text, y in zip(texts, exact, strict=True):
        if y <= 0:
            continue
        counts = asdict(script_counts(text))
        x = [float(counts[name]) for name in FITTED]
        target = y - sum(w * counts[name] for name, w in FIXED_WEIGHTS.items())
        weight = 1.0 / y  # (1/sqrt(y))**2 in the normal equations
        for i in range(k):
            xty[i] += weight * x[i] * target
            for j in range(k):
                xtx[i][j] += weight * x[i] * x[j]
    beta = _solve(xtx, xty)
    return EstimateCoefficients(**{name: round(b, 3) for name, b in zip(FITTED, beta, strict=True)})


def _errors(estimates: Sequence[int], exact: Sequence[int]) -> tuple[float, float]:
    rel = [(e - y) / y for e, y in zip(estimates, exact, strict=True) if y > 0]
    return (100 * sum(abs(r) for r in rel) / len(rel), 100 * sum(rel) / len(rel))


def _cell(estimates: Sequence[int], exact: Sequence[int]) -> str:
    mape, bias = _errors(estimates, exact)
    return f"{mape:.1f}% / {bias:+.1f}%"


_Exact = dict[str, dict[str, list[int]]]
"""Exact counts per dataset, per encoding (and ``generic``: their maximum), per text."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, help="the shared data folder (../shared/data)")
    parser.add_argument("--fit", action="store_true", help="print refitted coefficients")
    args = parser.parse_args(argv)

    by_dataset = load_texts(args.data)
    counters: dict[str, TokenCounter] = {e: counter_for_encoding(e) for e in EXACT_ENCODINGS}
    exact = {
        name: {e: [c.count(t) for t in texts] for e, c in counters.items()}
        for name, texts in by_dataset.items()
    }
    for name in exact:
        exact[name]["generic"] = [max(col) for col in zip(*exact[name].values(), strict=True)]
    families = [*EXACT_ENCODINGS, "generic"]

    if args.fit:
        _print_fit(by_dataset, exact, families)
    else:
        _print_table(by_dataset, exact, families)
    return 0


def _print_fit(by_dataset: Mapping[str, list[str]], exact: _Exact, families: Sequence[str]) -> None:
    """Refitted coefficients per family, on the fit half of every dataset."""
    for family in families:
        texts, targets = [], []
        for name, ds_texts in by_dataset.items():
            for text, y in zip(ds_texts, exact[name][family], strict=True):
                if _is_fit_half(text):
                    texts.append(text)
                    targets.append(y)
        coefficients = fit_coefficients(texts, targets)
        print(f'"{family}": {coefficients!r},')


def _print_table(by_dataset: Mapping[str, list[str]], exact: _Exact, families: Sequence[str]) -> None:
    """Error of each estimator against the exact counts on the held-out half, per dataset
    and pooled per language (a Markdown table)."""
    estimators = {f: EstimateCounter(f) for f in families}
    header = [
        "dataset",
        "lang",
        "texts",
        *EXACT_ENCODINGS,
        "generic (vs max)",
        "chars/4 (vs o200k)",
    ]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    pooled: dict[str, dict[str, tuple[list[int], list[int]]]] = {}
    for name, texts in by_dataset.items():
        lang = DATASETS[name][0]
        held = [i for i, t in enumerate(texts) if not _is_fit_half(t)]
        row = [name, lang, str(len(held))]
        for family in [*families, "chars/4"]:
            truth_family = "o200k_base" if family == "chars/4" else family
            truth = [exact[name][truth_family][i] for i in held]
            if family == "chars/4":
                est = [max(1, round(len(texts[i]) / 4)) for i in held]
            else:
                est = [estimators[family].count(texts[i]) for i in held]
            row.append(_cell(est, truth))
            pool = pooled.setdefault(lang, {}).setdefault(family, ([], []))
            pool[0].extend(est)
            pool[1].extend(truth)
        print("| " + " | ".join(row) + " |")
    for lang, pools in pooled.items():
        n = len(next(iter(pools.values()))[0])
        cells = [
            f"{_cell(*pools[f])} (Σ {100 * (sum(pools[f][0]) / sum(pools[f][1]) - 1):+.1f}%)"
            for f in [*families, "chars/4"]
        ]
        print("| " + " | ".join([f"**all {lang}**", lang, str(n), *cells]) + " |")
    fitted = [f.name for f in fields(EstimateCoefficients)]
    print(f"\nfixed weights: {dict(FIXED_WEIGHTS)}; fitted per family: {fitted}")

if __name__ == "__main__":
    raise SystemExit(main())
