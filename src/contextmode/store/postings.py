"""The recall index kept in the store: BM25 postings written with the turns.

A store with this ability (SQLite, PostgreSQL, Redis) writes, in the same
transaction (Redis: script run) as the turns it appends, each new turn's postings: for every term
of the turn (as `text.index_terms.turn_counts` counts it, the same function
the in-memory index uses) one packed record ``(seq, tf, dl)``, appended to the
term's row for the turn's *block* of `BLOCK` consecutive seqs. It also keeps
the session's index statistics (turns indexed, their total length and the last
indexed seq). A worker then answers recall by reading only the query terms'
rows, never the turns; sealed blocks (all of whose seqs are written) never
change, so a worker may cache them.

SQL stores (SQLite, PostgreSQL; `LAYOUT` 2) write the open block as small rows
of `SUB` seqs keyed block first (``recall_recent``: an append rewrites a few
hundred bytes on a page or two instead of a growing 6 KB row per term) and
merge them into the block's rows when it seals, in the same transaction; they
keep each term's document frequency over the sealed blocks in a row of its own
(``recall_df``, added to at each seal), so a term's frequency is one lookup plus
its open-block rows. Redis keeps its own layout (`store.redis.postings`).

A session written before the index existed has no statistics row: appends
leave it alone (its index would have a hole) until `index_backfill` has caught
it up (``contextmode index``, resumable: each batch commits its postings with
the new ``indexed_seq``), and recall meanwhile uses the in-process index. A
session indexed at layout 1 (before the frequency rows) counts its postings
until the same command converts it (one transaction per session).
"""

from __future__ import annotations

import struct
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeGuard, runtime_checkable

import numpy as np

from .._protocols import implements
from ..text.index_terms import PREVIOUS_WEIGHT, indexed, turn_counts
from ..text.index_terms import analyze as analyze_terms
from ..types import NewTurn, SessionKey, Turn
from .base import SharesConnection, one_connection

__all__ = [
    "BLOCK",
    "LAYOUT",
    "POSTING",
    "SUB",
    "AppendInput",
    "IndexHead",
    "IndexStats",
    "KeptHeads",
    "PostingRows",
    "PostingsStore",
    "SharesConnection",
    "TurnsAt",
    "analyze_texts",
    "append_input",
    "catch_up",
    "completes_block",
    "has_postings",
    "one_connection",
    "open_subs",
    "postings_for",
    "reads_turns_at",
]

BLOCK = 512
"""Seqs per sealed postings row: a 100,000-turn session is ~200 rows for its commonest term."""

SUB = 32
"""Seqs per row of the open block (SQL stores): an append rewrites at most one such row
(≤ 384 bytes); when the block seals, its rows are merged into one row of `BLOCK` seqs."""


def completes_block(first_seq: int, last_seq: int) -> bool:
    """True when turns ``first_seq``..``last_seq`` complete a block, so their append merges
    the block's small rows into its postings (a seal): the one append in `BLOCK` that takes long."""
    return (last_seq + 1) // BLOCK > first_seq // BLOCK


LAYOUT = 2
"""Index layout a SQL store writes: 2 keeps each term's document frequency in a row of
its own; a session indexed before (layout 1) counts its postings until `catch_up`
converts it."""

POSTING = np.dtype([("seq", "<i4"), ("tf", "<f4"), ("dl", "<f4")])
"""One packed posting: turn seq, term frequency, the turn's indexed length."""

_PACK = struct.Struct("<iff").pack
"""One `POSTING` record's bytes (the same float32 rounding as numpy's cast; for the few
postings of an append, ~8× cheaper than building an array per term: 0.07 against 0.5 µs)."""


@dataclass(frozen=True, kw_only=True)
class IndexStats:
    """A session's stored index statistics."""

    indexed_seq: int = 0
    """Last seq whose postings are stored (0 = none); below the session's last seq
    only for a session written before the index existed and not caught up yet."""
    docs: int = 0
    """Turns indexed (system turns are not)."""
    total_len: float = 0.0
    """Sum of the indexed turns' lengths (for the average document length)."""
    exists: bool = False
    """False for a session that has no statistics row (new, or not migrated)."""
    layout: int = LAYOUT
    """`LAYOUT` of the stored index (below it: `catch_up` converts the session)."""


@dataclass(frozen=True, kw_only=True)
class PostingRows:
    """What appending some turns adds to the index."""

    rows: Sequence[tuple[str, int, bytes]]
    """``(term, block, packed postings)`` to append to that term's row of that block."""
    docs: int
    """Turns indexed."""
    length: float
    """Their total length."""
    df: Mapping[str, int]
    """term → how many of the turns contain it (added to its document frequency)."""


@dataclass(frozen=True)
class IndexHead:
    """What an append needs before computing its postings: the session's last seq, the
    turn there (its terms expand the first appended turn's) and the index state."""

    last: int
    previous: Turn | None
    """The turn at ``last``."""
    indexed_seq: int | None
    """``None``: the session has no index (new, or written before the index existed)."""
    digest: str = ""
    """A store's fingerprint of the turn at ``last`` (Redis: SHA-1 of its JSON; '' = none)."""

    @property
    def writes_index(self) -> bool:
        """Whether an append after ``last`` indexes its turns (index current, or new session)."""
        return self.indexed_seq == self.last if self.indexed_seq is not None else self.last == 0

    def numbered(self, turns: Sequence[NewTurn]) -> list[Turn]:
        """``turns`` numbered after ``last`` (for their postings)."""
        return _numbered(self.last, turns)


def _numbered(last: int, turns: Sequence[NewTurn]) -> list[Turn]:
    """``turns`` as the turns they become after seq ``last``."""
    return [
        Turn(seq=last + i, role=t.role, content=t.content, tokens=t.tokens,
             created_at=t.created_at, metadata=dict(t.metadata))
        for i, t in enumerate(turns, start=1)
    ]


class KeptHeads:
    """The `IndexHead` the next append of each session needs, as this process's last append
    of it left it, so a worker that keeps writing one session (a question, then its answer)
    need not read it first; the store's write checks the assumed head (last seq and that
    turn), so a stale entry (another worker wrote, the session was re-created) costs a redo.
    A bounded LRU of short turns, each kept ``seconds`` at most and dropped at once when this
    process erases the session, so a forgotten turn's text does not linger."""

    def __init__(self, *, sessions: int = 1024, seconds: float = 30.0, chars: int = 4096) -> None:
        self._sessions, self._seconds, self._chars = sessions, seconds, chars
        self._heads: OrderedDict[tuple[str, str], tuple[float, IndexHead]] = OrderedDict()

    def __contains__(self, key: tuple[str, str]) -> bool:
        return key in self._heads

    def take(self, key: tuple[str, str]) -> IndexHead | None:
        """The session's kept head, removed (an append either replaces it or must read)."""
        kept = self._heads.pop(key, None)
        if kept is None or time.monotonic() - kept[0] > self._seconds:
            return None
        return kept[1]

    def forget(self, key: tuple[str, str]) -> None:
        self._heads.pop(key, None)

    def keep(
        self, key: tuple[str, str], before: int, turns: Sequence[NewTurn], *,
        indexed: bool, digest: str = "", size: int = 0,
    ) -> None:
        """Keep what the next append needs after ``turns`` were appended after seq ``before``
        (``indexed``: their postings were written; if not, the entry says "no index" and the
        next append's write decides again). A long last turn (``size`` chars stored, e.g. a
        tool result) is not held in memory: the next append reads it."""
        if not turns or max(size, len(turns[-1].content)) > self._chars:
            return
        last = before + len(turns)
        previous = _numbered(last - 1, turns[-1:])[0]
        self._heads[key] = (time.monotonic(), IndexHead(last, previous, last if indexed else None, digest))
        while len(self._heads) > self._sessions:
            self._heads.popitem(last=False)


def within_cap(capped: Iterable[str], counts: Mapping[str, int], cap: int, most: int) -> list[str]:
    """The capped terms `PostingsStore.query_postings` reads: the first ``most`` (in their
    order) found in at most ``cap`` turns by ``counts``."""
    return [t for t in capped if counts.get(t, 0) <= cap][: max(most, 0)]


def open_subs(indexed_seq: int, from_block: int = 0) -> range:
    """The sub-blocks (`SUB` seqs each) of the open block up to ``indexed_seq``, from
    block ``from_block`` on: where a SQL store's small rows can be (at most 16)."""
    per_block = BLOCK // SUB
    first = max(from_block, (indexed_seq + 1) // BLOCK) * per_block
    return range(first, indexed_seq // SUB + 1)


def analyze_texts(texts: Sequence[str]) -> dict[str, list[str]]:
    """Index terms of each text, computed before a write transaction so that the
    analysis (and loading its dictionaries) never runs while the store is locked."""
    return {text: analyze_terms(text) for text in texts}


@dataclass(frozen=True, slots=True)
class AppendInput:
    """What a driver's `append` takes: the store front builds it (`append_input` for a driver
    with postings), once, before the driver's transaction."""

    key: tuple[str, str]
    """``(tenant, session_id)``."""
    user_id: str | None
    turns: list[NewTurn]
    analyzed: dict[str, list[str]]
    """Index terms of each turn's content and speaker name (`analyze_texts`)."""


def append_input(
    tenant: str, session_id: str, turns: Sequence[NewTurn], user_id: str | None
) -> AppendInput:
    """The turns listed and their texts analysed: an append's prologue, before its
    transaction (the write lock is held only to write). The ids and the user come checked
    (the store front's)."""
    listed = list(turns)
    speakers = [t.metadata["speaker"] for t in listed if isinstance(t.metadata.get("speaker"), str)]
    return AppendInput(
        key=(tenant, session_id), user_id=user_id, turns=listed,
        analyzed=analyze_texts([t.content for t in listed] + speakers),
    )


def postings_for(
    turns: Sequence[Turn], previous: Turn | None, *,
    analyzed: Mapping[str, list[str]] | None = None, block_size: int = BLOCK,
) -> PostingRows:
    """The postings of ``turns`` (consecutive seqs), given the turn just before them;
    ``analyzed`` holds texts already analysed (`analyze_texts`); rows are grouped by
    blocks of ``block_size`` seqs (``block`` = seq // block_size)."""
    known = analyzed or {}

    def analyze(text: str) -> list[str]:
        terms = known.get(text)
        return list(terms) if terms is not None else analyze_terms(text)

    weight = PREVIOUS_WEIGHT
    prev_terms = analyze(previous.content) if previous is not None and indexed(previous) else []
    grouped: dict[tuple[str, int], list[tuple[int, float, float]]] = {}
    docs, length = 0, 0.0
    for turn in turns:
        if not indexed(turn):
            prev_terms = []
            continue
        counts, prev_terms = turn_counts(turn, prev_terms, weight, analyze)
        dl = float(np.float32(sum(counts.values())))
        docs += 1
        length += dl
        block = turn.seq // block_size
        for term, tf in counts.items():
            grouped.setdefault((term, block), []).append((turn.seq, tf, dl))
    rows = [
        (term, block, _PACK(*entries[0]) if len(entries) == 1 else b"".join(_PACK(*e) for e in entries))
        for (term, block), entries in grouped.items()
    ]
    df: dict[str, int] = {}
    for (term, _), entries in grouped.items():
        df[term] = df.get(term, 0) + len(entries)
    return PostingRows(rows=rows, docs=docs, length=length, df=df)


@runtime_checkable
class PostingsStore(Protocol):
    """A store that keeps the recall index beside the log (see the module docstring)."""

    async def index_stats(self, key: SessionKey) -> IndexStats:
        """The session's index statistics (all 0 / ``exists=False`` when it has none)."""
        ...

    async def postings(
        self, key: SessionKey, terms: Sequence[str], *, from_block: int = 0
    ) -> dict[str, list[tuple[int, bytes]]]:
        """For each of ``terms`` that has postings: its ``(block, packed)`` rows with
        ``block >= from_block``, in block order. A row may hold several consecutive
        blocks (``block`` is then the first one's): readers split by seq, not by row."""
        ...

    async def term_counts(self, key: SessionKey, terms: Sequence[str]) -> dict[str, int]:
        """How many indexed turns contain each of ``terms`` (absent terms left out)."""
        ...

    async def query_postings(
        self, key: SessionKey, terms: Mapping[str, int], *,
        capped: Mapping[str, int], cap: int, most: int,
    ) -> tuple[dict[str, list[tuple[int, bytes]]], dict[str, int]]:
        """A query's postings in one read (one statement, script or read transaction): the
        rows of ``terms`` (term → first block wanted, as `postings` reads them) and of the
        first ``most`` ``capped`` terms (in their order) found in at most ``cap`` turns; and
        the document frequency (as `term_counts`) of each capped term found. Recall's semantic
        neighbours are capped, heaviest first: one found in many turns is left out of the
        query unread, and so are those past the query's last."""
        ...

    async def index_backfill(self, key: SessionKey, *, batch: int = 2000) -> int:
        """Index up to ``batch`` turns the stored index lacks, in one transaction that
        also advances ``indexed_seq``; return how many turns were indexed (0 = caught up)."""
        ...

    async def sessions_to_index(self, *, limit: int = 1000) -> list[tuple[str, str, int, int]]:
        """Sessions whose index lags their log: ``(tenant, session_id, indexed_seq, last_seq)``."""
        ...


def has_postings(store: object) -> TypeGuard[PostingsStore]:
    """True when ``store`` keeps the recall index itself."""
    return implements(store, PostingsStore)


@runtime_checkable
class TurnsAt(Protocol):
    """A store that reads a session's turns at scattered seqs in one round trip (the
    turns recall returns: hits and their neighbours, spread over the whole log)."""

    async def turns_at(self, key: SessionKey, seqs: Sequence[int]) -> list[Turn]:
        """The turns at ``seqs`` that exist, oldest first."""
        ...


def reads_turns_at(store: object) -> TypeGuard[TurnsAt]:
    """True when ``store`` reads turns at a list of seqs in one call (`TurnsAt`)."""
    return implements(store, TurnsAt)


def unpack(rows: Sequence[tuple[int, bytes]]) -> np.ndarray:
    """One term's rows (block order) as one array of `POSTING` records, seq ascending."""
    if not rows:
        return np.empty(0, dtype=POSTING)
    return np.frombuffer(b"".join(data for _, data in rows), dtype=POSTING)


async def catch_up(
    store: PostingsStore,
    *,
    batch: int = 2000,
    on_progress: Callable[[int, int], None] | None = None,
) -> int:
    """Index every turn the stored index lacks (sessions written before it existed).

    Each batch commits its postings together with the session's new ``indexed_seq``,
    so an interrupted run loses nothing and a second run resumes where it stopped.
    ``on_progress(done, total)`` is called after each batch (turns). Returns the
    number of turns indexed.
    """
    lagging = await store.sessions_to_index(limit=1_000_000)
    total = sum(last - done for _, _, done, last in lagging)
    indexed = 0
    if on_progress is not None:
        on_progress(0, total)
    for tenant, session_id, _, _ in lagging:
        key = SessionKey(tenant, session_id)
        while (added := await store.index_backfill(key, batch=batch)) > 0:
            indexed += added
            if on_progress is not None:
                on_progress(indexed, max(total, indexed))
    return indexed
