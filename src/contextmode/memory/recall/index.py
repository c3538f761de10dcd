"""An incremental BM25 index over one session's turns.

Why hand-written rather than ``bm25s`` or ``rank_bm25``: those build a matrix
from the whole corpus and must rebuild it when a document arrives, so every new
turn would cost O(history). A chat session grows one turn at a time, and
DESIGN principle 3 asks that a turn cost O(that turn). This index keeps

- postings: term → the ascending turn seqs that contain it and their term
  frequencies, in two growable C arrays (`array.array`, amortised O(1) append),
- each turn's length in another C array indexed by seq,
- the running document count and total length (for avgdl),

so `add` touches only the new turn's terms, and BM25 statistics (idf, avgdl)
are always those of the current collection: an index grown turn by turn scores
exactly like one built from scratch.

Search views those arrays through numpy without copying (`np.frombuffer`) and
sums the terms' contributions into one dense accumulator (`ScoreSums`, which a
feedback pass extends), then takes the top k (`top_k`): exact BM25, a few vector
operations per query term, no Python loop over postings. At 100,000 turns a query costs about a millisecond (see
benchmarks/bench_recall.py), so no approximate pruning is needed.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from ...text.index_terms import PREVIOUS_WEIGHT, analyze, indexed, turn_counts
from ...types import Turn

__all__ = [
    "BM25Index",
    "BM25Params",
    "Contributions",
    "QueryMemo",
    "RecallIndex",
    "ScoreSums",
    "bm25_idf",
    "bm25_scores",
    "top_k",
]


@runtime_checkable
class RecallIndex(Protocol):
    """A per-session retrieval index over turns, grown one turn at a time."""

    @property
    def last_seq(self) -> int:
        """Highest turn seq added so far (0 when empty)."""
        ...

    def add(self, turn: Turn) -> None:
        """Index ``turn``; a turn whose seq is not above `last_seq` is ignored (idempotent)."""
        ...

    def search(
        self, query: str, *, k: int, exclude_from_seq: int | None = None
    ) -> list[tuple[int, float]]:
        """The ``k`` best ``(seq, score)`` pairs for ``query``, best first.

        Turns with ``seq >= exclude_from_seq`` (the recent window, already in
        the prompt) are left out.
        """
        ...


def bm25_scores(
    tfs: np.ndarray, norms: np.ndarray, *, idf: float, weight: float, k1: float
) -> np.ndarray:
    """BM25 contributions of one query term: ``tfs`` and ``norms`` (k1·(1 − b + b·dl/avgdl))
    per matching turn, float32 like the stored arrays, so every index scores alike."""
    # weight·idf·tf·(k1 + 1) / (tf + norm), the same float32 operations in the same order,
    # in place: one temporary fewer per step.
    scores: np.ndarray = np.multiply(tfs, weight * idf)
    scores *= k1 + 1.0
    scores /= tfs + norms
    return scores


def bm25_idf(docs: int, df: int) -> float:
    """The non-negative BM25 idf, ln(1 + (N − df + 0.5)/(df + 0.5))."""
    return math.log(1.0 + (docs - df + 0.5) / (df + 0.5))


@dataclass(frozen=True, kw_only=True)
class BM25Params:
    """Okapi BM25 constants (the usual defaults; see docs/quality.md)."""

    k1: float = 1.2
    """Term-frequency saturation."""
    b: float = 0.75
    """Strength of document-length normalisation (0 = none, 1 = full)."""
    previous_weight: float = PREVIOUS_WEIGHT
    """Index each turn together with the words of the turn before it, each
    occurrence counting this much (document expansion; 0 = off): an answer
    ("Bowls and a cup!") is found by the question it answers ("What did you
    make in pottery class?"), while the turn's own words still weigh more."""


class BM25Index:
    """Incremental inverted index with exact BM25 scoring (see the module docstring)."""

    def __init__(
        self,
        params: BM25Params | None = None,
        *,
        analyzer: Callable[[str], list[str]] = analyze,
    ) -> None:
        self.params = params or BM25Params()
        self._analyze = analyzer
        self._seqs: dict[str, array[int]] = {}
        # seq -> its distinct terms, for pseudo-relevance feedback (no counts needed there)
        self._terms_of: dict[int, tuple[str, ...]] = {}
        self._tfs: dict[str, array[float]] = {}
        # _doc_len[seq] = number of terms of that turn (0 for unindexed seqs; slot 0 unused)
        self._doc_len: array[float] = array("f", [0.0])
        self._docs = 0
        self._total_len = 0.0
        self._norm_cache: tuple[int, int, np.ndarray] | None = None
        self._previous_terms: list[str] = []

    @property
    def last_seq(self) -> int:
        return len(self._doc_len) - 1

    def __len__(self) -> int:
        """Number of indexed turns."""
        return self._docs

    @property
    def docs(self) -> int:
        """Number of indexed turns."""
        return self._docs

    def add(self, turn: Turn) -> None:
        if turn.seq <= self.last_seq:
            return
        # Seqs are gapless in a session; pad anyway so a skipped seq cannot shift the rest.
        self._doc_len.extend([0.0] * (turn.seq - len(self._doc_len)))
        if not indexed(turn):
            self._doc_len.append(0.0)
            self._previous_terms = []
            return
        counts, self._previous_terms = turn_counts(
            turn, self._previous_terms, self.params.previous_weight, self._analyze
        )
        length = sum(counts.values())
        self._doc_len.append(float(length))
        self._docs += 1
        self._total_len += length
        self._terms_of[turn.seq] = tuple(counts)
        for term, tf in counts.items():
            seqs = self._seqs.get(term)
            if seqs is None:
                self._seqs[term] = array("q", [turn.seq])
                self._tfs[term] = array("f", [float(tf)])
            else:
                seqs.append(turn.seq)
                self._tfs[term].append(float(tf))

    def doc_terms(self, seq: int) -> tuple[str, ...]:
        """The distinct terms of turn ``seq`` (empty when not indexed)."""
        return self._terms_of.get(seq, ())

    def df(self, term: str) -> int:
        """How many indexed turns contain ``term``."""
        seqs = self._seqs.get(term)
        return len(seqs) if seqs is not None else 0

    def idf(self, term: str) -> float:
        """BM25 idf of ``term`` (the non-negative variant, ln(1 + (N-df+.5)/(df+.5)))."""
        return bm25_idf(self._docs, self.df(term))

    def query_terms(self, query: str) -> Counter[str]:
        """The analysed query, term → how often it occurs."""
        return Counter(self._analyze(query))

    def search(
        self, query: str, *, k: int, exclude_from_seq: int | None = None
    ) -> list[tuple[int, float]]:
        return self.search_terms(self.query_terms(query), k=k, exclude_from_seq=exclude_from_seq)

    def _norm(self) -> np.ndarray:
        """k1·(1 − b + b·dl/avgdl) per seq, cached until the next `add`."""
        key = (self._docs, self.last_seq)
        if self._norm_cache is None or self._norm_cache[:2] != key:
            k1, b = self.params.k1, self.params.b
            avgdl = self._total_len / self._docs if self._docs else 1.0
            dl = np.frombuffer(self._doc_len, dtype=np.float32)
            norm = k1 * (1.0 - b + b * dl / (avgdl or 1.0))
            self._norm_cache = (*key, norm)
        return self._norm_cache[2]

    def search_terms(
        self,
        weights: Mapping[str, float],
        *,
        k: int,
        exclude_from_seq: int | None = None,
        memo: QueryMemo | None = None,
    ) -> list[tuple[int, float]]:
        """Like `search`, with explicit per-term query weights (for query expansion).

        ``memo`` keeps each term's contributions and their running sums for a second
        search of the same query (feedback adds terms, the message's own keep their
        weights: only the new terms are scored and added); pass the same `QueryMemo` to
        both, with nothing added to the index in between."""
        if self._docs == 0 or k <= 0:
            return []
        k1 = self.params.k1
        norm = self._norm()
        memo = QueryMemo() if memo is None else memo
        scored: list[tuple[tuple[str, float], list[tuple[np.ndarray, np.ndarray]]]] = []
        for term, weight in weights.items():
            seqs_arr = self._seqs.get(term)
            if weight <= 0 or seqs_arr is None:
                continue
            key = (term, weight)
            done = memo.contributions.get(key)
            if done is None:
                term_seqs = np.frombuffer(seqs_arr, dtype=np.int64)
                tfs = np.frombuffer(self._tfs[term], dtype=np.float32)
                if exclude_from_seq is not None:
                    end = int(np.searchsorted(term_seqs, exclude_from_seq))
                    term_seqs, tfs = term_seqs[:end], tfs[:end]
                contribution = bm25_scores(
                    tfs, norm.take(term_seqs), idf=self.idf(term), weight=weight, k1=k1
                )
                done = memo.contributions[key] = [(term_seqs, contribution)] if len(term_seqs) else []
            if done:
                scored.append((key, done))
        return memo.sums.rank(scored, size=len(self._doc_len), k=k)


Contributions = list[tuple[np.ndarray, np.ndarray]]
"""One query term's BM25 contributions: ``(seqs ascending, contribution per seq)`` parts,
disjoint, none empty."""


class ScoreSums:
    """One query's BM25 scores per seq, summed term by term in query order from 0.

    A second `rank` whose terms start with the first's (pseudo-relevance feedback only
    appends terms) adds only the new terms' contributions to the same sums: each seq's
    score is the same additions in the same order either way, so the ranking is the same
    as summing all terms afresh. Scores only grow when terms are added, so the first
    pass's k-th best score bounds the second's from below (`top_k`'s ``floor``)."""

    def __init__(self) -> None:
        self._scores: np.ndarray | None = None
        self._summed: list[tuple[str, float]] = []
        self._kth = 0.0
        self._k = 0

    def rank(
        self, scored: Sequence[tuple[tuple[str, float], Contributions]], *, size: int, k: int
    ) -> list[tuple[int, float]]:
        """The ``k`` best ``(seq, score)`` summing ``scored`` (term key → its non-empty
        contributions, in query order) over seqs ``0..size-1``."""
        if not scored:
            return []
        keys = [key for key, _ in scored]
        scores, summed = self._scores, len(self._summed)
        extends = scores is not None and len(scores) == size and keys[:summed] == self._summed
        if scores is None or not extends:
            parts = [part for _, parts in scored for part in parts]
            # bincount adds in input order: each seq's score sums its terms' contributions in
            # query order from 0, as a ``scores[seqs] +=`` per term would (seqs unique per term).
            scores = np.bincount(
                np.concatenate([seqs for seqs, _ in parts]),
                weights=np.concatenate([values for _, values in parts]),
                minlength=size,
            )
            floor = 0.0
        else:
            for _, parts in scored[summed:]:
                for seqs, values in parts:
                    scores[seqs] += values
            floor = self._kth if self._k == k else 0.0
        found = top_k(scores, k, floor=floor)
        self._scores, self._summed, self._k = scores, keys, k
        self._kth = found[-1][1] if len(found) == k else 0.0
        return found


class QueryMemo:
    """What one query's searches share (`BM25Index.search_terms`): each term's
    contributions and their running sums. Valid while nothing is added to the index."""

    def __init__(self) -> None:
        self.contributions: dict[tuple[str, float], Contributions] = {}
        self.sums = ScoreSums()


def top_k(scores: np.ndarray, k: int, *, floor: float = 0.0) -> list[tuple[int, float]]:
    """The ``k`` best ``(seq, score)`` of a dense score array indexed by seq, best first;
    on equal scores the newer turn first.

    ``floor``: a score at least ``k`` turns are known to reach (0 = unknown); only turns
    scoring that much are looked at. When more turns than fit tie at the k-th score,
    which of them are kept is `np.argpartition`'s choice over all the turns that score,
    as it always was, so the result never depends on ``floor``."""
    hits = _unique_top(scores, k, floor)
    if hits is None:
        hits = np.flatnonzero(scores != 0)
        if len(hits) > k:
            hits = hits[np.argpartition(scores[hits], -k)[-k:]]
    values = scores[hits].tolist()
    order = sorted(zip(hits.tolist(), values, strict=True), key=lambda hit: (-hit[1], -hit[0]))
    return [(seq, float(score)) for seq, score in order]


_SAMPLE_STRIDE = 17
"""Every this-many-th score estimates a floor for `top_k` (odd: turns alternate speakers)."""


def _unique_top(scores: np.ndarray, k: int, floor: float) -> np.ndarray | None:
    """The seqs of the ``k`` best scores when no tie at the k-th score leaves a choice
    (exactly ``k`` turns score at least the k-th best, which is above 0); else None."""
    if floor <= 0 and len(scores) >= 4 * k * _SAMPLE_STRIDE:
        # The k-th best of a sample: its k best are k turns scoring at least that much.
        floor = float(np.partition(scores[::_SAMPLE_STRIDE], -k)[-k])
    candidates = np.flatnonzero(scores >= floor) if floor > 0 else None
    values = scores if candidates is None else scores[candidates]
    if len(values) < k:
        return None
    kth = float(np.partition(values, -k)[-k])
    if kth <= 0:
        return None
    top = np.flatnonzero(values >= kth)
    if len(top) != k:
        return None
    return top if candidates is None else candidates[top]
