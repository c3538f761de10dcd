"""The recall index in SQLite: postings rows and index statistics (see `store.postings`).

Functions take the connection and run inside the caller's transaction
(`_sqlite_admin.write` / `read`), so postings commit with the turns they index.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence

from ..types import Turn
from .postings import IndexStats, postings_for

__all__ = ["backfill", "index_turns", "lagging", "postings", "stats", "term_counts"]

Db = sqlite3.Connection
_W = "WHERE tenant = ? AND session_id = ?"


def stats(db: Db, key: tuple[str, str]) -> IndexStats:
    row = db.execute(f"SELECT indexed_seq, docs, total_len FROM recall_index {_W}", key).fetchone()
    if row is None:
        return IndexStats()
    return IndexStats(indexed_seq=row[0], docs=row[1], total_len=row[2], exists=True)


def _previous(db: Db, key: tuple[str, str], seq: int) -> Turn | None:
    from .sqlite import _TURN_SELECT, _turn

    row = db.execute(f"{_TURN_SELECT} AND t.seq = ?", (*key, seq)).fetchone()
    return _turn(row) if row else None


def index_turns(
    db: Db, key: tuple[str, str], turns: Sequence[Turn], last: int, analyzed: Mapping[str, list[str]]
) -> None:
    """Index ``turns`` just appended after seq ``last`` when the index is current (or the
    session is new); a session whose index lags is left to `backfill`."""
    if not turns:
        return
    current = stats(db, key)
    if current.exists and current.indexed_seq != last:
        return
    if not current.exists and last > 0:
        return  # written before the index existed: `contextmode index` catches it up
    _write(db, key, turns, _previous(db, key, last) if last else None, analyzed)


def _write(
    db: Db, key: tuple[str, str], turns: Sequence[Turn], previous: Turn | None,
    analyzed: Mapping[str, list[str]] | None = None,
) -> None:
    added = postings_for(turns, previous, analyzed=analyzed)
    db.executemany(
        "INSERT INTO recall_postings (tenant, session_id, term, block, data) VALUES (?, ?, ?, ?, ?)"
        " ON CONFLICT (tenant, session_id, term, block)"
        " DO UPDATE SET data = CAST(data || excluded.data AS BLOB)",
        [(*key, term, block, data) for term, block, data in added.rows],
    )
    db.execute(
        "INSERT INTO recall_index (tenant, session_id, indexed_seq, docs, total_len)"
        " VALUES (?, ?, ?, ?, ?) ON CONFLICT (tenant, session_id) DO UPDATE SET"
        " indexed_seq = excluded.indexed_seq, docs = docs + excluded.docs,"
        " total_len = total_len + excluded.total_len",
        (*key, turns[-1].seq, added.docs, added.length),
    )


def postings(
    db: Db, key: tuple[str, str], terms: Sequence[str], from_block: int
) -> dict[str, list[tuple[int, bytes]]]:
    out: dict[str, list[tuple[int, bytes]]] = {}
    for start in range(0, len(terms), 500):
        chunk = list(terms[start : start + 500])
        marks = ",".join("?" * len(chunk))
        for term, block, data in db.execute(
            f"SELECT term, block, data FROM recall_postings {_W} AND term IN ({marks})"
            " AND block >= ? ORDER BY term, block",
            (*key, *chunk, from_block),
        ):
            out.setdefault(term, []).append((block, bytes(data)))
    return out


def term_counts(db: Db, key: tuple[str, str], terms: Sequence[str]) -> dict[str, int]:
    from .postings import POSTING

    out: dict[str, int] = {}
    for start in range(0, len(terms), 500):
        chunk = list(terms[start : start + 500])
        marks = ",".join("?" * len(chunk))
        for term, size in db.execute(
            f"SELECT term, SUM(LENGTH(data)) FROM recall_postings {_W} AND term IN ({marks})"
            " GROUP BY term",
            (*key, *chunk),
        ):
            out[term] = int(size) // POSTING.itemsize
    return out


def backfill(db: Db, key: tuple[str, str], batch: int) -> int:
    """Index the next ``batch`` turns the index lacks (caller holds the write transaction)."""
    from .sqlite import _TURN_SELECT, _turn

    row = db.execute(f"SELECT last_seq FROM sessions {_W}", key).fetchone()
    if row is None:
        return 0
    current = stats(db, key)
    done = current.indexed_seq
    if done >= row[0]:
        if not current.exists:
            db.execute(
                "INSERT INTO recall_index (tenant, session_id, indexed_seq, docs, total_len)"
                " VALUES (?, ?, 0, 0, 0)", key,
            )
        return 0
    turns = [
        _turn(r)
        for r in db.execute(
            f"{_TURN_SELECT} AND t.seq > ? AND t.seq <= ? ORDER BY t.seq", (*key, done, done + batch)
        )
    ]
    if not turns:
        return 0
    _write(db, key, turns, _previous(db, key, done) if done else None)
    return len(turns)


def lagging(db: Db, limit: int) -> list[tuple[str, str, int, int]]:
    rows = db.execute(
        "SELECT s.tenant, s.session_id, COALESCE(r.indexed_seq, 0), s.last_seq FROM sessions s"
        " LEFT JOIN recall_index r ON r.tenant = s.tenant AND r.session_id = s.session_id"
        " WHERE r.indexed_seq IS NULL OR r.indexed_seq < s.last_seq LIMIT ?",
        (limit,),
    ).fetchall()
    return [(r[0], r[1], r[2], r[3]) for r in rows]
