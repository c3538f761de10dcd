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
scores term by term into one dense accumulator, then takes the top k with
`argpartition`: exact BM25, a few vector operations per query term, no Python
loop over postings. At 100,000 turns a query costs about a millisecond (see
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

from ...types import Turn
from .text import analyze, indexed

__all__ = [
    "BM25Index",
    "BM25Params",
    "RecallIndex",
    "bm25_idf",
    "bm25_scores",
    "top_k",
    "turn_counts",
    "turn_text",
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


def turn_text(turn: Turn) -> str:
    """What is indexed of a turn: its content plus the speaker's name when known."""
    speaker = turn.metadata.get("speaker")
    return f"{speaker} {turn.content}" if isinstance(speaker, str) else turn.content


def turn_counts(
    turn: Turn,
    previous_terms: Sequence[str],
    previous_weight: float,
    analyzer: Callable[[str], list[str]] = analyze,
) -> tuple[dict[str, float], list[str]]:
    """A turn's indexed term frequencies, and the terms it passes on to the next turn.

    Its content terms, the speaker's name when known (the same terms as analysing
    `turn_text`), and ``previous_terms`` (the turn before's own words) counting
    ``previous_weight`` each (document expansion, `BM25Params.previous_weight`).
    Only the turn's own words pass on: expansion reaches one turn back, no further.
    Every index (in memory or in a store) counts a turn with this one function.
    """
    content_terms = analyzer(turn.content)
    counts: dict[str, float] = dict(Counter(content_terms))
    speaker = turn.metadata.get("speaker")
    if isinstance(speaker, str):
        for term in analyzer(speaker):
            counts[term] = counts.get(term, 0.0) + 1.0
    if previous_weight > 0:
        for term in previous_terms:
            counts[term] = counts.get(term, 0.0) + previous_weight
    return counts, content_terms


def bm25_scores(
    tfs: np.ndarray, norms: np.ndarray, *, idf: float, weight: float, k1: float
) -> np.ndarray:
    """BM25 contributions of one query term: ``tfs`` and ``norms`` (k1·(1 − b + b·dl/avgdl))
    per matching turn, float32 like the stored arrays, so every index scores alike."""
    scores: np.ndarray = weight * idf * tfs * (k1 + 1.0) / (tfs + norms)
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
    previous_weight: float = 0.5
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
        memo: dict[tuple[str, float], tuple[np.ndarray, np.ndarray]] | None = None,
    ) -> list[tuple[int, float]]:
        """Like `search`, with explicit per-term query weights (for query expansion).

        ``memo`` keeps each term's contributions for a second search of the same query
        (feedback adds terms, the message's own keep their weights); pass the same dict
        to both, with nothing added to the index in between."""
        if self._docs == 0 or k <= 0:
            return []
        k1 = self.params.k1
        norm = self._norm()
        memo = {} if memo is None else memo
        seqs: list[np.ndarray] = []
        contributions: list[np.ndarray] = []
        for term, weight in weights.items():
            seqs_arr = self._seqs.get(term)
            if weight <= 0 or seqs_arr is None:
                continue
            done = memo.get((term, weight))
            if done is None:
                term_seqs = np.frombuffer(seqs_arr, dtype=np.int64)
                tfs = np.frombuffer(self._tfs[term], dtype=np.float32)
                if exclude_from_seq is not None:
                    end = int(np.searchsorted(term_seqs, exclude_from_seq))
                    term_seqs, tfs = term_seqs[:end], tfs[:end]
                scored = bm25_scores(tfs, norm[term_seqs], idf=self.idf(term), weight=weight, k1=k1)
                done = memo[(term, weight)] = (term_seqs, scored)
            if len(done[0]):
                seqs.append(done[0])
                contributions.append(done[1])
        if not seqs:
            return []
        # Sums each turn's contributions in query-term order from 0, as a dense
        # ``scores[seqs] +=`` per term would (seqs are unique within a term).
        scores = np.bincount(
            np.concatenate(seqs), weights=np.concatenate(contributions), minlength=len(self._doc_len)
        )
        return top_k(scores, k)


def top_k(scores: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The ``k`` best ``(seq, score)`` of a dense score array indexed by seq, best first;
    on equal scores the newer turn first."""
    hits = np.flatnonzero(scores)
    if len(hits) > k:
        top = np.argpartition(scores[hits], -k)[-k:]
        hits = hits[top]
    order = sorted(hits.tolist(), key=lambda seq: (-scores[seq], -seq))
    return [(seq, float(scores[seq])) for seq in order]
