"""Shared evaluation metrics: classification and rank scores, exact match, restoration F, BLEU.

All functions are pure Python and deterministic. Text metrics work on token lists;
`tokenize` gives the tokens used throughout the project's evaluations: jieba words for
text with Chinese characters, lower-cased words and punctuation marks otherwise.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

__all__ = [
    "balanced_accuracy",
    "binary_scores",
    "bleu",
    "bleu_tokens",
    "exact_match",
    "ngrams",
    "normalize_text",
    "pearson",
    "ranks",
    "restoration_scores",
    "roc_auc",
    "spearman",
    "tokenize",
]

_CJK = re.compile(r"[\u3400-\u9fff]")
_WORD = re.compile(r"[\u3400-\u9fff]|[A-Za-z0-9]+(?:'[A-Za-z]+)?|[^\sA-Za-z0-9\u3400-\u9fff]")
_PUNCT_SPACE = re.compile(r"\s+")


def binary_scores(gold: Sequence[bool | int], predicted: Sequence[bool | int]) -> dict[str, float]:
    """Accuracy, precision/recall/F1 of the positive class and macro-F1 over both classes.

    Each figure is a share in 0–1 rounded to four decimals; a ratio with a zero
    denominator counts as 0. Also returns ``tp``, ``fp``, ``fn``, ``tn`` and ``n``.
    """
    if len(gold) != len(predicted):
        raise ValueError("gold and predicted differ in length")
    tp = sum(1 for g, p in zip(gold, predicted, strict=True) if g and p)
    fp = sum(1 for g, p in zip(gold, predicted, strict=True) if not g and p)
    fn = sum(1 for g, p in zip(gold, predicted, strict=True) if g and not p)
    tn = len(gold) - tp - fp - fn

    def f1(t: int, false_pos: int, false_neg: int) -> float:
        return 2 * t / (2 * t + false_pos + false_neg) if t else 0.0

    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    positive_f1 = f1(tp, fp, fn)
    negative_f1 = f1(tn, fn, fp)
    return {
        "accuracy": round((tp + tn) / len(gold), 4) if gold else 0.0,
        "precision": round(precision, 4),
        "recall": round(recall, 4),
        "f1": round(positive_f1, 4),
        "macro_f1": round((positive_f1 + negative_f1) / 2, 4),
        "tp": tp, "fp": fp, "fn": fn, "tn": tn, "n": len(gold),
    }


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks of ``values``; tied values share their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Pearson correlation in -1–1; ``nan`` for fewer than two points or a constant side."""
    n = len(xs)
    if n < 2:
        return float("nan")
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    return sxy / math.sqrt(sxx * syy) if sxx and syy else float("nan")


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman rank correlation (Pearson of the tie-averaged ranks), -1–1 or ``nan``."""
    return pearson(ranks(xs), ranks(ys))


def roc_auc(scores: Sequence[float], positive: Sequence[bool]) -> float:
    """ROC AUC in 0–1 by the Mann–Whitney statistic (ties count half); ``nan`` without both classes."""
    ranked = ranks(scores)
    n_pos = sum(positive)
    n_neg = len(positive) - n_pos
    if not n_pos or not n_neg:
        return float("nan")
    rank_sum = sum(r for r, p in zip(ranked, positive, strict=True) if p)
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def balanced_accuracy(scores: Sequence[float], positive: Sequence[bool], cut: float) -> float:
    """Mean of the recalls of both classes when ``score >= cut`` predicts positive; 0–1 or ``nan``."""
    tp = sum(1 for s, p in zip(scores, positive, strict=True) if p and s >= cut)
    tn = sum(1 for s, p in zip(scores, positive, strict=True) if not p and s < cut)
    n_pos = sum(positive)
    n_neg = len(positive) - n_pos
    if not n_pos or not n_neg:
        return float("nan")
    return (tp / n_pos + tn / n_neg) / 2


def normalize_text(text: str) -> str:
    """``text`` without whitespace runs at the ends and collapsed inside, lower-cased."""
    return _PUNCT_SPACE.sub(" ", text.strip()).lower()


def exact_match(predictions: Sequence[str], references: Sequence[str]) -> float:
    """Share (0–1) of predictions equal to their reference after `normalize_text`."""
    if not predictions:
        return 0.0
    hits = sum(
        normalize_text(p) == normalize_text(r)
        for p, r in zip(predictions, references, strict=True)
    )
    return round(hits / len(predictions), 4)


@lru_cache(maxsize=65536)
def _tokenize_cached(text: str) -> tuple[str, ...]:
    if _CJK.search(text):
        from ..text import words

        return tuple(w.lower() for w in words(text) if w.strip())
    return tuple(_WORD.findall(text.lower()))


def tokenize(text: str) -> list[str]:
    """Evaluation tokens: jieba words when ``text`` has Chinese characters, else words."""
    return list(_tokenize_cached(text))


def ngrams(tokens: Sequence[str], n: int) -> list[tuple[str, ...]]:
    """The ``n``-grams of ``tokens`` in order."""
    return [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]


def _restored(tokens: Sequence[str], original: set[str], n: int) -> Counter[tuple[str, ...]]:
    return Counter(g for g in ngrams(tokens, n) if any(t not in original for t in g))


def restoration_scores(
    originals: Sequence[str],
    predictions: Sequence[str],
    references: Sequence[str],
    *,
    tokenizer: Callable[[str], list[str]] = tokenize,
    max_n: int = 3,
) -> dict[str, float]:
    """Restoration precision/recall/F per n-gram order (Pan et al., EMNLP 2019).

    A restored n-gram of a rewrite is one that contains at least one token absent
    from the original utterance. Counts are clipped per item and summed over the
    corpus: ``p_n = matched / restored n-grams predicted``, ``r_n = matched / restored
    n-grams in the references``. Returns ``restoration_p1 … restoration_f3`` (0–1).
    A prediction that restores nothing scores 0 recall and, by convention, 0 precision.
    """
    matched = [0] * (max_n + 1)
    predicted = [0] * (max_n + 1)
    expected = [0] * (max_n + 1)
    for original, prediction, reference in zip(originals, predictions, references, strict=True):
        base = set(tokenizer(original))
        pred_tokens, ref_tokens = tokenizer(prediction), tokenizer(reference)
        for n in range(1, max_n + 1):
            pred = _restored(pred_tokens, base, n)
            ref = _restored(ref_tokens, base, n)
            matched[n] += sum((pred & ref).values())
            predicted[n] += sum(pred.values())
            expected[n] += sum(ref.values())
    result: dict[str, float] = {}
    for n in range(1, max_n + 1):
        p = matched[n] / predicted[n] if predicted[n] else 0.0
        r = matched[n] / expected[n] if expected[n] else 0.0
        f = 2 * p * r / (p + r) if p + r else 0.0
        result[f"restoration_p{n}"] = round(p, 4)
        result[f"restoration_r{n}"] = round(r, 4)
        result[f"restoration_f{n}"] = round(f, 4)
    return result


def bleu_tokens(text: str) -> list[str]:
    """BLEU tokens: each Chinese character alone, words and punctuation marks, lower-cased.

    Character-level for Chinese, like sacrebleu's ``zh`` tokenizer, so the score does
    not depend on a word segmenter.
    """
    return _WORD.findall(text.lower())


def bleu(
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    tokenizer: Callable[[str], list[str]] = bleu_tokens,
    max_n: int = 4,
) -> dict[str, Any]:
    """Corpus BLEU-4 (Papineni et al. 2002) in 0–100, one reference per hypothesis.

    Clipped n-gram counts are summed over the corpus, then the geometric mean of the
    precisions times the brevity penalty. Smoothing: an order with no match counts
    ``1 / 2^k`` matches (the k-th such order), as sacrebleu's ``exp`` method.
    Returns ``bleu``, ``precisions`` (percent), ``bp`` and the token lengths.
    """
    matches = [0] * max_n
    totals = [0] * max_n
    hyp_len = ref_len = 0
    for hypothesis, reference in zip(hypotheses, references, strict=True):
        hyp, ref = tokenizer(hypothesis), tokenizer(reference)
        hyp_len += len(hyp)
        ref_len += len(ref)
        for n in range(1, max_n + 1):
            h, r = Counter(ngrams(hyp, n)), Counter(ngrams(ref, n))
            matches[n - 1] += sum((h & r).values())
            totals[n - 1] += max(len(hyp) - n + 1, 0)
    if hyp_len == 0:
        return {"bleu": 0.0, "precisions": [0.0] * max_n, "bp": 0.0,
                "hyp_len": 0, "ref_len": ref_len}
    precisions: list[float] = []
    smooth = 1.0
    for m, t in zip(matches, totals, strict=True):
        if t == 0:
            precisions.append(0.0)
        elif m == 0:
            smooth *= 2
            precisions.append(100.0 / (smooth * t))
        else:
            precisions.append(100.0 * m / t)
    if min(precisions) <= 0:
        score = 0.0
    else:
        log_mean = sum(math.log(p / 100.0) for p in precisions) / max_n
        bp = 1.0 if hyp_len > ref_len else math.exp(1 - ref_len / hyp_len)
        score = 100.0 * bp * math.exp(log_mean)
    bp = 1.0 if hyp_len > ref_len else math.exp(1 - ref_len / hyp_len)
    return {
        "bleu": round(score, 2),
        "precisions": [round(p, 2) for p in precisions],
        "bp": round(bp, 4),
        "hyp_len": hyp_len,
        "ref_len": ref_len,
    }
