"""Recall over the index a store keeps (`store.postings`): no turn is read to rank.

A query reads the postings rows of its terms only, and scores them with the same
BM25 functions as the in-memory `BM25Index` (`bm25_scores`, `bm25_idf`,
`ScoreSums`), so both give the same ranking. Sealed blocks (every seq of the block
indexed) never change: this process keeps them per session (LRU), and a later
query reads only the open block of each cached term. A session deleted and
re-created is told apart by its creation time.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from ...store.postings import BLOCK, LAYOUT, POSTING, IndexStats, PostingsStore, unpack, within_cap
from ...text.index_terms import analyze, indexed, turn_counts
from ...types import SessionKey, Turn
from .index import BM25Params, Contributions, ScoreSums, bm25_idf, bm25_scores

__all__ = ["StoredIndex", "StoredPostings", "TurnReader"]

TurnReader = Callable[[Sequence[int]], Awaitable[dict[int, Turn]]]
"""Reads one session's turns by seq (`recall.fetch_turns` bound to the session)."""


@dataclass(frozen=True)
class _Postings:
    """One term's postings as three contiguous columns, seq ascending: scoring them runs
    unit-stride vector code (the packed records' fields are strided views, ~2× slower)."""

    seq: np.ndarray
    tf: np.ndarray
    dl: np.ndarray

    def __len__(self) -> int:
        return len(self.seq)

    def cut(self, start: int, end: int | None = None) -> _Postings:
        return _Postings(self.seq[start:end], self.tf[start:end], self.dl[start:end])

    @staticmethod
    def of(records: np.ndarray) -> _Postings:
        """From packed `POSTING` records."""
        return _Postings(
            records["seq"].astype(np.intp),
            np.ascontiguousarray(records["tf"]),
            np.ascontiguousarray(records["dl"]),
        )

    @staticmethod
    def join(first: _Postings, then: _Postings) -> _Postings:
        if not len(first):
            return then
        return _Postings(*(np.concatenate([a, b]) for a, b in zip(
            (first.seq, first.tf, first.dl), (then.seq, then.tf, then.dl), strict=True
        )))


_NONE = _Postings.of(np.empty(0, dtype=POSTING))


@dataclass
class _Cached:
    created_at: datetime | None
    sealed: dict[str, tuple[int, _Postings]] = field(default_factory=dict)
    """term → (blocks below this are in the columns, their postings)."""


class StoredPostings:
    """Reads (and caches the sealed blocks of) postings kept in a store."""

    def __init__(self, *, max_sessions: int = 64, params: BM25Params | None = None) -> None:
        self.params = params or BM25Params()
        self._max_sessions = max_sessions
        self._sessions: OrderedDict[tuple[str, str], _Cached] = OrderedDict()

    def forget(self, tenant: str, session_id: str) -> bool:
        """Drop a session's cached blocks; True if there were any."""
        return self._sessions.pop((tenant, session_id), None) is not None

    def sessions(self) -> list[tuple[str, str]]:
        """``(tenant, session_id)`` of every session whose blocks are cached here."""
        return list(self._sessions)

    def _cached(self, tenant: str, session_id: str, created_at: datetime | None) -> _Cached:
        key = (tenant, session_id)
        entry = self._sessions.get(key)
        if entry is None or entry.created_at != created_at:
            entry = self._sessions[key] = _Cached(created_at=created_at)
            while len(self._sessions) > self._max_sessions:
                self._sessions.popitem(last=False)
        self._sessions.move_to_end(key)
        return entry

    async def index(
        self, store: PostingsStore, tenant: str, session_id: str, *,
        stats: IndexStats, created_at: datetime | None,
    ) -> StoredIndex:
        """A view of the session's stored index at ``stats``."""
        return StoredIndex(
            self, store, tenant, session_id, stats=stats,
            cache=self._cached(tenant, session_id, created_at),
        )


class StoredIndex:
    """One query's view of a stored index: BM25 search, document frequencies, turn terms."""

    def __init__(
        self, owner: StoredPostings, store: PostingsStore, tenant: str, session_id: str, *,
        stats: IndexStats, cache: _Cached,
    ) -> None:
        self.params = owner.params
        self._store = store
        self._key = (tenant, session_id)
        self._stats = stats
        self._cache = cache
        self._parts: dict[str, tuple[_Postings, ...]] = {}
        """term → its postings as disjoint arrays, seq ascending (the cached sealed blocks,
        then the open block): scored part by part, never copied into one array."""
        self._terms_of: dict[int, tuple[str, ...]] = {}
        self._df: dict[str, int] = {}
        self._contributions: dict[tuple[str, float, int | None], Contributions] = {}
        self._sums: dict[int | None, ScoreSums] = {}
        """exclude_from_seq → the query's running score sums (`ScoreSums`)."""

    async def load_terms(
        self, terms: Sequence[str], *, capped: Sequence[str] = (), cap: int = 0, most: int | None = None
    ) -> None:
        """Read the postings of ``terms`` not read yet (sealed blocks from the cache) and of
        the first ``most`` (default all) ``capped`` terms found in at most ``cap`` turns, and
        the document frequency of every capped term: one store read
        (`PostingsStore.query_postings`). A capped term left unread is read by a later call."""
        plain: dict[str, int] = {}
        for term in dict.fromkeys(terms):
            if term not in self._parts:
                plain[term] = self._cache.sealed.get(term, (0, None))[0]
        over: dict[str, int] = {}
        for term in dict.fromkeys(capped):
            if term not in plain and term not in self._parts and term not in self._df:
                over[term] = self._cache.sealed.get(term, (0, None))[0]
        if not plain and not over:
            return
        most = len(over) if most is None else most
        rows, counts = await self._store.query_postings(SessionKey(*self._key), plain, capped=over, cap=cap, most=most)
        kept = within_cap(over, counts, cap, most)
        for term in over:
            self._df[term] = counts.get(term, 0)
        for term in [*plain, *kept]:
            self._add(term, plain.get(term, over.get(term, 0)), rows.get(term, []))

    def _add(self, term: str, start: int, rows: Sequence[tuple[int, bytes]]) -> None:
        """Keep a term's postings read from block ``start`` on (its sealed blocks cached)."""
        sealed_now = (self._stats.indexed_seq + 1) // BLOCK
        old = self._cache.sealed.get(term, (0, _NONE))[1]
        if not rows:
            # Nothing read (a query term no turn holds, or no new block): the cached blocks
            # as they are, without the array work below (same result, ~10x less time).
            if sealed_now > start:
                self._cache.sealed[term] = (sealed_now, old)
            self._parts[term] = (old,)
            self._df[term] = len(old)
            return
        fetched = _Postings.of(unpack(rows))
        # Split by seq: a store may return several blocks in one row.
        cut = int(np.searchsorted(fetched.seq, sealed_now * BLOCK))
        sealed = _Postings.join(old, fetched.cut(0, cut)) if cut else old
        if sealed_now > start:
            self._cache.sealed[term] = (sealed_now, sealed)
        tail = fetched.cut(cut)
        # Another worker may have appended since the statistics were read.
        tail = tail.cut(0, int(np.searchsorted(tail.seq, self._stats.indexed_seq, side="right")))
        self._parts[term] = (sealed, tail) if len(tail) else (sealed,)
        self._df[term] = len(sealed) + len(tail)

    @property
    def docs(self) -> int:
        """Number of indexed turns."""
        return self._stats.docs

    def df(self, term: str) -> int:
        """How many turns contain ``term`` (0 until `load_terms` or `load_df` read it)."""
        return self._df.get(term, 0)

    def idf(self, term: str) -> float:
        return bm25_idf(self._stats.docs, self._df.get(term, 0))

    async def load_df(self, terms: Sequence[str]) -> None:
        """Document frequencies of ``terms`` without reading their postings."""
        missing = [t for t in dict.fromkeys(terms) if t not in self._df]
        # Layout 2 keeps one frequency row per term: one lookup for all. Before it, a term
        # whose sealed blocks are cached is counted from them and its open block (a few
        # short rows); counting the others reads every row of theirs in the store.
        keeps_df = self._stats.layout >= LAYOUT
        cached = [] if keeps_df else [t for t in missing if t in self._cache.sealed]
        if cached:
            await self.load_terms(cached)
        missing = [t for t in missing if t not in self._df]
        if missing:
            counts = await self._store.term_counts(SessionKey(*self._key), missing)
            for term in missing:
                self._df[term] = counts.get(term, 0)

    def search_terms(
        self, weights: Mapping[str, float], *, k: int, exclude_from_seq: int | None = None
    ) -> list[tuple[int, float]]:
        """Exact BM25 over the loaded terms, like `BM25Index.search_terms` (the same
        additions in the same order: each turn's score sums its terms' contributions in
        query order, starting from 0; a second search of the query adds only its new terms)."""
        docs = self._stats.docs
        if docs == 0 or k <= 0:
            return []
        scored: list[tuple[tuple[str, float], Contributions]] = []
        for term, weight in weights.items():
            if weight <= 0 or term not in self._parts or not self._df.get(term):
                continue
            parts = self._scored(term, weight, exclude_from_seq)
            if parts:
                scored.append(((term, weight), parts))
        sums = self._sums.setdefault(exclude_from_seq, ScoreSums())
        return sums.rank(scored, size=self._stats.indexed_seq + 1, k=k)

    def _scored(
        self, term: str, weight: float, exclude_from_seq: int | None
    ) -> Contributions:
        """A term's ``(seqs, BM25 contributions)`` per part, kept for the query's second
        pass (feedback adds terms; the message's own keep their weights)."""
        key = (term, weight, exclude_from_seq)
        done = self._contributions.get(key)
        if done is not None:
            return done
        k1, b = self.params.k1, self.params.b
        avgdl = self._stats.total_len / self._stats.docs
        idf = self.idf(term)
        out = []
        for postings in self._parts[term]:
            if exclude_from_seq is not None:
                postings = postings.cut(0, int(np.searchsorted(postings.seq, exclude_from_seq)))
            if not len(postings):
                continue
            norms = k1 * (1.0 - b + b * postings.dl / (avgdl or 1.0))
            out.append((postings.seq, bm25_scores(postings.tf, norms, idf=idf, weight=weight, k1=k1)))
        self._contributions[key] = out
        return out

    async def load_doc_terms(self, seqs: Sequence[int], read: TurnReader) -> None:
        """Index terms of turns ``seqs`` (re-analysed from the turns and the ones before)."""
        wanted = sorted({s for seq in seqs for s in (seq - 1, seq) if s >= 1})
        turns = await read(wanted)
        for seq in seqs:
            turn = turns.get(seq)
            if turn is None or not indexed(turn):
                continue
            before = turns.get(seq - 1)
            previous = analyze(before.content) if before is not None and indexed(before) else []
            counts, _ = turn_counts(turn, previous, self.params.previous_weight)
            self._terms_of[seq] = tuple(counts)

    def doc_terms(self, seq: int) -> tuple[str, ...]:
        return self._terms_of.get(seq, ())
