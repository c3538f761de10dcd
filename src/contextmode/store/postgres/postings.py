"""The recall index in PostgreSQL: postings rows and index statistics (see `store.postings`).

Functions take a connection inside the caller's transaction, so postings commit
with the turns they index (the append holds the session row ``FOR UPDATE``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ...types import NewTurn, Turn
from .._codec import metadata_json
from ..postings import (
    BLOCK,
    LAYOUT,
    POSTING,
    SUB,
    IndexHead,
    IndexStats,
    completes_block,
    postings_for,
)
from .rows import turn as turn_row

__all__ = [
    "NO_INDEX", "append_args", "backfill", "convert", "index_turns", "lagging", "postings", "seal", "stats",
    "term_counts",
]

Conn = Any  # asyncpg.Connection, imported lazily
_W = "WHERE tenant = $1 AND session_id = $2"
_TURN_COLS = "t.seq, t.role, t.content, t.tokens, t.created_at, t.metadata, NULL::float8 AS emotion"


async def stats(db: Conn, key: tuple[str, str]) -> IndexStats:
    row = await db.fetchrow(
        f"SELECT indexed_seq, docs, total_len, layout FROM recall_index {_W}", *key
    )
    if row is None:
        return IndexStats()
    return IndexStats(indexed_seq=row[0], docs=row[1], total_len=row[2], exists=True, layout=row[3])


async def _previous(db: Conn, key: tuple[str, str], seq: int) -> Turn | None:
    row = await db.fetchrow(f"SELECT {_TURN_COLS} FROM turns t {_W} AND t.seq = $3", *key, seq)
    return turn_row(row) if row else None


NO_INDEX: list[Any] = [None] * 11
"""`append_args` for an append that neither writes nor reads the index (switched off)."""


def append_args(
    head: IndexHead | None, turns: Sequence[NewTurn], analyzed: Mapping[str, list[str]]
) -> list[Any]:
    """The append statement's index arguments: the postings of ``turns`` computed after
    ``head`` (the head this process's last append of the session left, `KeptHeads`), which
    the statement writes only if the session is still at that head (same last seq, index
    current, the same turn there); without a head, ``-1`` (matches no session): the statement
    returns what `index_turns` needs instead."""
    if head is None or not head.writes_index:
        return [-1, *NO_INDEX[1:]]
    numbered = head.numbered(turns)
    added = postings_for(numbered, head.previous, analyzed=analyzed, block_size=SUB)
    prev = head.previous
    return [
        head.last, prev.role if prev else None, prev.content if prev else None,
        metadata_json(prev.metadata) if prev else None,
        [r[0] for r in added.rows], [r[1] for r in added.rows], [r[2] for r in added.rows],
        numbered[-1].seq, added.docs, added.length, LAYOUT,
    ]


async def index_turns(
    db: Conn, key: tuple[str, str], turns: Sequence[Turn], row: Any, analyzed: Mapping[str, list[str]]
) -> bool:
    """After the append statement (``row``) wrote ``turns``: seal the blocks they complete if
    it wrote their postings, else index them here when the index is current (or the session
    is new); a session whose index lags is left to `backfill`. True if they are indexed."""
    if not turns:
        return False
    if row["indexed"]:
        if completes_block(turns[0].seq, turns[-1].seq):
            await seal(db, key, turns[0].seq // BLOCK, (turns[-1].seq + 1) // BLOCK)
        return True
    last = turns[0].seq - 1
    if row["seen_seq"] != last or row["indexed_seq"] != last:
        # The statement's snapshot predates a write that committed while it waited for the
        # session's lock (or shows an index that lags): read the state again, under the lock.
        row = await db.fetchrow(
            "SELECT r.indexed_seq, ROW(t.role, t.content, t.metadata::text) AS previous"
            " FROM (SELECT 1) one LEFT JOIN recall_index r ON r.tenant = $1 AND r.session_id = $2"
            " LEFT JOIN turns t ON t.tenant = $1 AND t.session_id = $2 AND t.seq = $3",
            *key, last,
        )
    indexed = row["indexed_seq"]
    if (indexed is not None and indexed != last) or (indexed is None and last > 0):
        return False  # lagging or written before the index existed: `contextmode index` catches up
    previous, before = None, row["previous"]
    if last and before is not None and before[1] is not None:
        # Its metadata too: an engine notice lends no words to the turn after it.
        previous = Turn(seq=last, role=before[0], content=before[1], tokens=0,
                        created_at=turns[0].created_at, metadata=json.loads(before[2]))
    await _write(db, key, turns, previous, analyzed)
    return True


async def _write(
    db: Conn, key: tuple[str, str], turns: Sequence[Turn], previous: Turn | None,
    analyzed: Mapping[str, list[str]] | None = None,
) -> None:
    """Postings of ``turns`` into the open block's small rows (`SUB` seqs a row, keyed
    block first: an append writes a few hundred bytes on a page or two, not a growing
    6 KB row and its TOAST per term) and the statistics, in one round trip; the blocks
    these turns complete are merged (`seal`)."""
    added = postings_for(turns, previous, analyzed=analyzed, block_size=SUB)
    await db.execute(
        "WITH p AS (INSERT INTO recall_recent (tenant, session_id, block, term, data)"
        " SELECT $1, $2, u.b, u.t, u.d FROM unnest($3::text[], $4::int[], $5::bytea[]) AS u(t, b, d)"
        " ON CONFLICT (tenant, session_id, block, term)"
        " DO UPDATE SET data = recall_recent.data || excluded.data)"
        " INSERT INTO recall_index (tenant, session_id, indexed_seq, docs, total_len, layout)"
        " VALUES ($1, $2, $6, $7, $8, $9) ON CONFLICT (tenant, session_id) DO UPDATE SET"
        " indexed_seq = excluded.indexed_seq, docs = recall_index.docs + excluded.docs,"
        " total_len = recall_index.total_len + excluded.total_len",
        *key, [r[0] for r in added.rows], [r[1] for r in added.rows], [r[2] for r in added.rows],
        turns[-1].seq, added.docs, added.length, LAYOUT,
    )
    sealed = (turns[-1].seq + 1) // BLOCK
    if completes_block(turns[0].seq, turns[-1].seq):
        await seal(db, key, turns[0].seq // BLOCK, sealed)


async def seal(db: Conn, key: tuple[str, str], first: int, sealed: int) -> None:
    """Merge the small rows of blocks ``first`` to ``sealed - 1`` (the ones that were open)
    into one row per term and block, and add their postings to the terms' frequency rows
    (one statement; the range skips the index entries of rows earlier seals deleted)."""
    per_block = BLOCK // SUB
    await db.execute(
        "WITH m AS (DELETE FROM recall_recent WHERE tenant = $1 AND session_id = $2"
        " AND block >= $4 AND block < $3 RETURNING term, block, data),"
        " p AS (INSERT INTO recall_postings (tenant, session_id, term, block, data)"
        f" SELECT $1, $2, term, block / {per_block}, string_agg(data, ''::bytea ORDER BY block)"
        f" FROM m GROUP BY term, block / {per_block}"
        " ON CONFLICT (tenant, session_id, term, block)"
        " DO UPDATE SET data = recall_postings.data || excluded.data)"
        " INSERT INTO recall_df (tenant, session_id, term, df)"
        f" SELECT $1, $2, term, SUM(octet_length(data)) / {POSTING.itemsize} FROM m GROUP BY term"
        " ON CONFLICT (tenant, session_id, term) DO UPDATE SET df = recall_df.df + excluded.df",
        *key, sealed * per_block, first * per_block,
    )


# The open block's sub-blocks (`postings.open_subs`, from block $4 on), each probed with the
# whole primary key: a probe never walks the entries of rows earlier seals deleted (without a
# vacuum they stay in the index, and a scan by term alone reads them all). ``LIMIT`` (there
# are at most 16) keeps the planner's estimate small: with generate_series's default of 1,000
# rows, 80 terms cost enough to start the JIT compiler (~1 s).
_OPEN = (
    f"SELECT g.b FROM recall_index i CROSS JOIN LATERAL generate_series(GREATEST($4,"
    f" (i.indexed_seq + 1) / {BLOCK}) * {BLOCK // SUB}, i.indexed_seq / {SUB}) AS g(b)"
    f" WHERE i.tenant = $1 AND i.session_id = $2 LIMIT {BLOCK // SUB}"
)
_OPEN_ROWS = (
    "FROM o CROSS JOIN LATERAL (SELECT y.block, y.data FROM recall_recent y WHERE y.tenant = $1"
    " AND y.session_id = $2 AND y.block = o.b AND y.term = q.term OFFSET 0) y"
)


def _rows(first_block: str, only: str = "") -> str:
    """A lateral probe for ``q.term``'s rows from block ``first_block`` on (SQL), the sealed
    rows then the open block's small rows; ``only``: a condition on ``q`` for reading any."""
    where = f" AND {only}" if only else ""
    return (
        "(SELECT x.block, -1 AS part, x.data FROM recall_postings x WHERE x.tenant = $1"
        f" AND x.session_id = $2 AND x.term = q.term AND x.block >= {first_block}{where}"
        f" UNION ALL SELECT y.block / {BLOCK // SUB}, y.block, y.data {_OPEN_ROWS}"
        f"{' WHERE ' + only if only else ''} OFFSET 0)"
    )


def _df(layout: str) -> str:
    """``q.term``'s frequency (SQL; 0 when it has none): layout 2's frequency row (sealed
    blocks) or, before it, its postings rows counted; then the open block's small rows.
    ``layout``: the parameter holding the current layout number."""
    return (
        f"COALESCE(CASE WHEN i.layout >= {layout} THEN (SELECT d.df FROM recall_df d"
        " WHERE d.tenant = $1 AND d.session_id = $2 AND d.term = q.term) ELSE (SELECT"
        f" SUM(octet_length(x.data)) / {POSTING.itemsize} FROM recall_postings x WHERE x.tenant = $1"
        " AND x.session_id = $2 AND x.term = q.term) END, 0) + COALESCE((SELECT"
        f" SUM(octet_length(y.data)) / {POSTING.itemsize} {_OPEN_ROWS}), 0)"
    )


# One primary-key range per term (a lateral probe; ``OFFSET 0`` keeps the planner from
# flattening it into a hash join over the whole session, which it picks whenever the
# table's statistics are missing or stale, e.g. right after a bulk load: 100× slower).
_POSTINGS = (
    f"WITH o AS MATERIALIZED ({_OPEN})"
    f" SELECT q.term, p.block, p.part, p.data FROM unnest($3::text[]) AS q(term) CROSS JOIN LATERAL {_rows('$4')} p"
)
_TERM_COUNTS = (
    f"WITH o AS MATERIALIZED ({_OPEN.replace('$4', '0')})"
    f" SELECT q.term, NULLIF({_df('$4')}, 0)"
    " FROM unnest($3::text[]) AS q(term)"
    " LEFT JOIN recall_index i ON i.tenant = $1 AND i.session_id = $2"
)
# `query_postings`: each capped term's frequency, then each term's rows from its own first
# block, unless capped and found in more than $7 turns or past the first $8 capped terms
# within that (a one-time filter: such a term's rows are never read).
_QUERY = (
    f"WITH o AS MATERIALIZED ({_OPEN.replace('$4', '0')}),"
    f" w AS MATERIALIZED (SELECT q.term, q.fb, q.ord, CASE WHEN q.capped THEN {_df('$6')} END AS df"
    " FROM unnest($3::text[], $4::int[], $5::bool[]) WITH ORDINALITY AS q(term, fb, capped, ord)"
    " LEFT JOIN recall_index i ON i.tenant = $1 AND i.session_id = $2),"
    " r AS MATERIALIZED (SELECT w.term, w.fb, w.df, (w.df IS NULL OR (w.df <= $7 AND"
    " COUNT(*) FILTER (WHERE w.df <= $7) OVER (ORDER BY w.ord) <= $8)) AS ok FROM w)"
    f" SELECT q.term, q.df, p.block, p.part, p.data FROM r AS q LEFT JOIN LATERAL {_rows('q.fb', 'q.ok')} p ON TRUE"
)


async def query_postings(
    db: Conn, key: tuple[str, str], terms: Mapping[str, int], capped: Mapping[str, int],
    limits: tuple[int, int],
) -> tuple[dict[str, list[tuple[int, bytes]]], dict[str, int]]:
    """``limits``: the cap and how many capped terms within it are read (`query_postings`)."""
    wanted = {**capped, **terms}
    names = list(wanted)
    flags = [t not in terms for t in names]
    parts: dict[str, list[tuple[int, int, bytes]]] = {}
    counts: dict[str, int] = {}
    found = await db.fetch(_QUERY, *key, names, [wanted[t] for t in names], flags, LAYOUT, *limits)
    for term, df, block, part, data in found:
        if df:
            counts[term] = int(df)
        if data is not None:
            parts.setdefault(term, []).append((block, part, bytes(data)))
    return {term: [(b, d) for b, _, d in sorted(rows)] for term, rows in parts.items()}, counts


async def postings(
    db: Conn, key: tuple[str, str], terms: Sequence[str], from_block: int
) -> dict[str, list[tuple[int, bytes]]]:
    parts: dict[str, list[tuple[int, int, bytes]]] = {}
    for term, block, part, data in await db.fetch(
        _POSTINGS, *key, list(dict.fromkeys(terms)), from_block
    ):
        parts.setdefault(term, []).append((block, part, bytes(data)))
    # Seq order: block, then the sealed row before the small rows (not promised by SQL).
    return {term: [(b, d) for b, _, d in sorted(rows)] for term, rows in parts.items()}


async def term_counts(db: Conn, key: tuple[str, str], terms: Sequence[str]) -> dict[str, int]:
    rows = await db.fetch(_TERM_COUNTS, *key, list(dict.fromkeys(terms)), LAYOUT)
    return {row[0]: int(row[1]) for row in rows if row[1] is not None}


async def convert(db: Conn, key: tuple[str, str]) -> None:
    """Give a session indexed at layout 1 its frequency rows, counted over its postings
    rows (the open block's small rows are counted when read; replacing any a seal kept
    meanwhile; caller holds the session row ``FOR UPDATE``, so no append slips in)."""
    await db.execute(
        "WITH counted AS (INSERT INTO recall_df (tenant, session_id, term, df)"
        f" SELECT $1, $2, term, SUM(octet_length(data)) / {POSTING.itemsize} FROM recall_postings"
        " WHERE tenant = $1 AND session_id = $2 GROUP BY term"
        " ON CONFLICT (tenant, session_id, term) DO UPDATE SET df = excluded.df)"
        " UPDATE recall_index SET layout = $3 WHERE tenant = $1 AND session_id = $2",
        *key, LAYOUT,
    )


async def backfill(db: Conn, key: tuple[str, str], batch: int) -> int:
    """Index the next ``batch`` turns the index lacks, or convert a session indexed at
    layout 1 (caller holds a transaction); return the turns done (0 = none left)."""
    last = await db.fetchval(f"SELECT last_seq FROM sessions {_W} FOR UPDATE", *key)
    if last is None:
        return 0
    current = await stats(db, key)
    done = current.indexed_seq
    converted = 0
    if current.exists and current.layout < LAYOUT:
        await convert(db, key)
        converted = done  # its turns count as done in `sessions_to_index`'s progress
    if done >= last:
        if not current.exists:
            await db.execute(
                "INSERT INTO recall_index (tenant, session_id, indexed_seq, docs, total_len, layout)"
                " VALUES ($1, $2, 0, 0, 0, $3) ON CONFLICT DO NOTHING", *key, LAYOUT,
            )
        return converted
    rows = await db.fetch(
        f"SELECT {_TURN_COLS} FROM turns t {_W} AND t.seq > $3 AND t.seq <= $4 ORDER BY t.seq",
        *key, done, done + batch,
    )
    turns = [turn_row(r) for r in rows]
    if not turns:
        return converted
    await _write(db, key, turns, await _previous(db, key, done) if done else None)
    return converted + len(turns)


async def lagging(db: Conn, limit: int) -> list[tuple[str, str, int, int]]:
    """Sessions whose index lags their log, or is of an older layout (counted from 0)."""
    rows = await db.fetch(
        "SELECT s.tenant, s.session_id, CASE WHEN r.layout < $2 THEN 0 ELSE"
        " COALESCE(r.indexed_seq, 0) END, s.last_seq FROM sessions s"
        " LEFT JOIN recall_index r ON r.tenant = s.tenant AND r.session_id = s.session_id"
        " WHERE r.indexed_seq IS NULL OR r.indexed_seq < s.last_seq OR r.layout < $2 LIMIT $1",
        limit, LAYOUT,
    )
    return [(r[0], r[1], r[2], r[3]) for r in rows]
