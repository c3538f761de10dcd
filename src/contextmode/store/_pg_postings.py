"""The recall index in PostgreSQL: postings rows and index statistics (see `store.postings`).

Functions take a connection inside the caller's transaction, so postings commit
with the turns they index (the append holds the session row ``FOR UPDATE``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..types import Turn
from .postings import POSTING, IndexStats, postings_for

__all__ = ["backfill", "index_turns", "lagging", "postings", "stats", "term_counts"]

Conn = Any  # asyncpg.Connection, imported lazily
_W = "WHERE tenant = $1 AND session_id = $2"
_TURN_COLS = "t.seq, t.role, t.content, t.tokens, t.created_at, t.metadata, NULL::float8 AS emotion"


async def stats(db: Conn, key: tuple[str, str]) -> IndexStats:
    row = await db.fetchrow(f"SELECT indexed_seq, docs, total_len FROM recall_index {_W}", *key)
    if row is None:
        return IndexStats()
    return IndexStats(indexed_seq=row[0], docs=row[1], total_len=row[2], exists=True)


async def _previous(db: Conn, key: tuple[str, str], seq: int) -> Turn | None:
    from .postgres import _turn

    row = await db.fetchrow(f"SELECT {_TURN_COLS} FROM turns t {_W} AND t.seq = $3", *key, seq)
    return _turn(row) if row else None


async def index_turns(
    db: Conn, key: tuple[str, str], turns: Sequence[Turn], last: int, analyzed: Mapping[str, list[str]]
) -> None:
    """Index ``turns`` just appended after seq ``last`` when the index is current (or the
    session is new); a session whose index lags is left to `backfill`."""
    if not turns:
        return
    row = await db.fetchrow(
        "SELECT r.indexed_seq, t.role, t.content, t.metadata FROM (SELECT 1) one"
        " LEFT JOIN recall_index r ON r.tenant = $1 AND r.session_id = $2"
        " LEFT JOIN turns t ON t.tenant = $1 AND t.session_id = $2 AND t.seq = $3",
        *key, last,
    )
    indexed = row["indexed_seq"]
    if (indexed is not None and indexed != last) or (indexed is None and last > 0):
        return  # lagging or written before the index existed: `contextmode index` catches up
    previous = None
    if last and row["content"] is not None:
        # Its metadata too: an engine notice lends no words to the turn after it.
        previous = Turn(seq=last, role=row["role"], content=row["content"], tokens=0,
                        created_at=turns[0].created_at, metadata=json.loads(row["metadata"]))
    await _write(db, key, turns, previous, analyzed)


async def _write(
    db: Conn, key: tuple[str, str], turns: Sequence[Turn], previous: Turn | None,
    analyzed: Mapping[str, list[str]] | None = None,
) -> None:
    added = postings_for(turns, previous, analyzed=analyzed)
    # One round trip: the postings upsert and the statistics upsert.
    await db.execute(
        "WITH p AS (INSERT INTO recall_postings (tenant, session_id, term, block, data)"
        " SELECT $1, $2, u.t, u.b, u.d FROM unnest($3::text[], $4::int[], $5::bytea[]) AS u(t, b, d)"
        " ON CONFLICT (tenant, session_id, term, block)"
        " DO UPDATE SET data = recall_postings.data || excluded.data)"
        " INSERT INTO recall_index (tenant, session_id, indexed_seq, docs, total_len)"
        " VALUES ($1, $2, $6, $7, $8) ON CONFLICT (tenant, session_id) DO UPDATE SET"
        " indexed_seq = excluded.indexed_seq, docs = recall_index.docs + excluded.docs,"
        " total_len = recall_index.total_len + excluded.total_len",
        *key, [r[0] for r in added.rows], [r[1] for r in added.rows], [r[2] for r in added.rows],
        turns[-1].seq, added.docs, added.length,
    )


# One primary-key range per term (a lateral probe; ``OFFSET 0`` keeps the planner from
# flattening it into a hash join over the whole session, which it picks whenever the
# table's statistics are missing or stale, e.g. right after a bulk load: 100× slower).
_POSTINGS = (
    "SELECT q.term, p.block, p.data FROM unnest($3::text[]) AS q(term) CROSS JOIN LATERAL"
    " (SELECT x.block, x.data FROM recall_postings x WHERE x.tenant = $1 AND x.session_id = $2"
    " AND x.term = q.term AND x.block >= $4 ORDER BY x.block OFFSET 0) p"
)
_TERM_COUNTS = (
    "SELECT q.term, (SELECT SUM(octet_length(x.data)) FROM recall_postings x"
    " WHERE x.tenant = $1 AND x.session_id = $2 AND x.term = q.term) FROM unnest($3::text[]) AS q(term)"
)


async def postings(
    db: Conn, key: tuple[str, str], terms: Sequence[str], from_block: int
) -> dict[str, list[tuple[int, bytes]]]:
    out: dict[str, list[tuple[int, bytes]]] = {}
    for term, block, data in await db.fetch(_POSTINGS, *key, list(dict.fromkeys(terms)), from_block):
        out.setdefault(term, []).append((block, bytes(data)))
    for rows in out.values():
        rows.sort(key=lambda row: row[0])  # block order (already so, but not promised by SQL)
    return out


async def term_counts(db: Conn, key: tuple[str, str], terms: Sequence[str]) -> dict[str, int]:
    rows = await db.fetch(_TERM_COUNTS, *key, list(dict.fromkeys(terms)))
    return {row[0]: int(row[1]) // POSTING.itemsize for row in rows if row[1] is not None}


async def backfill(db: Conn, key: tuple[str, str], batch: int) -> int:
    """Index the next ``batch`` turns the index lacks (caller holds a transaction)."""
    from .postgres import _turn

    last = await db.fetchval(f"SELECT last_seq FROM sessions {_W} FOR UPDATE", *key)
    if last is None:
        return 0
    current = await stats(db, key)
    done = current.indexed_seq
    if done >= last:
        if not current.exists:
            await db.execute(
                "INSERT INTO recall_index (tenant, session_id, indexed_seq, docs, total_len)"
                " VALUES ($1, $2, 0, 0, 0) ON CONFLICT DO NOTHING", *key,
            )
        return 0
    rows = await db.fetch(
        f"SELECT {_TURN_COLS} FROM turns t {_W} AND t.seq > $3 AND t.seq <= $4 ORDER BY t.seq",
        *key, done, done + batch,
    )
    turns = [_turn(r) for r in rows]
    if not turns:
        return 0
    await _write(db, key, turns, await _previous(db, key, done) if done else None)
    return len(turns)


async def lagging(db: Conn, limit: int) -> list[tuple[str, str, int, int]]:
    rows = await db.fetch(
        "SELECT s.tenant, s.session_id, COALESCE(r.indexed_seq, 0), s.last_seq FROM sessions s"
        " LEFT JOIN recall_index r ON r.tenant = s.tenant AND r.session_id = s.session_id"
        " WHERE r.indexed_seq IS NULL OR r.indexed_seq < s.last_seq LIMIT $1",
        limit,
    )
    return [(r[0], r[1], r[2], r[3]) for r in rows]
