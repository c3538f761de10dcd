"""The recall index in SQLite: postings rows and index statistics (see `store.postings`).

Functions take the connection and run inside the caller's transaction
(`_sqlite_admin.write` / `read`), so postings commit with the turns they index.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from ...types import Turn
from ..postings import (
    BLOCK,
    LAYOUT,
    POSTING,
    SUB,
    IndexStats,
    completes_block,
    open_subs,
    postings_for,
    within_cap,
)
from .rows import TURN_SELECT
from .rows import turn as turn_row

__all__ = ["backfill", "convert", "index_turns", "lagging", "postings", "seal", "stats", "term_counts"]

Db = sqlite3.Connection
_W = "WHERE tenant = ? AND session_id = ?"


def stats(db: Db, key: tuple[str, str]) -> IndexStats:
    row = db.execute(
        f"SELECT indexed_seq, docs, total_len, layout FROM recall_index {_W}", key
    ).fetchone()
    if row is None:
        return IndexStats()
    return IndexStats(indexed_seq=row[0], docs=row[1], total_len=row[2], exists=True, layout=row[3])


def _previous(db: Db, key: tuple[str, str], seq: int) -> Turn | None:
    row = db.execute(f"{TURN_SELECT} AND t.seq = ?", (*key, seq)).fetchone()
    return turn_row(row) if row else None


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
    """Postings of ``turns`` into the open block's small rows and the statistics; the
    blocks these turns complete are merged (`seal`). The small rows are keyed block
    first, so one append dirties a page or two, not one page per term."""
    added = postings_for(turns, previous, analyzed=analyzed, block_size=SUB)
    sealed_after = (turns[-1].seq + 1) // BLOCK
    first_open = sealed_after * (BLOCK // SUB)
    if completes_block(turns[0].seq, turns[-1].seq):
        seal(db, key, sealed_after, [(t, s, d) for t, s, d in added.rows if s < first_open])
    db.executemany(
        "INSERT INTO recall_recent (tenant, session_id, block, term, data) VALUES (?, ?, ?, ?, ?)"
        " ON CONFLICT (tenant, session_id, block, term)"
        " DO UPDATE SET data = CAST(data || excluded.data AS BLOB)",
        [(*key, s, t, d) for t, s, d in added.rows if s >= first_open],
    )
    db.execute(
        "INSERT INTO recall_index (tenant, session_id, indexed_seq, docs, total_len, layout)"
        " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, session_id) DO UPDATE SET"
        " indexed_seq = excluded.indexed_seq, docs = docs + excluded.docs,"
        " total_len = total_len + excluded.total_len",
        (*key, turns[-1].seq, added.docs, added.length, LAYOUT),
    )


def seal(
    db: Db, key: tuple[str, str], sealed: int, more: Sequence[tuple[str, int, bytes]] = ()
) -> None:
    """Merge the small rows of every block below ``sealed`` (then ``more``, newer rows
    ``(term, sub-block, packed)`` of those blocks) into one postings row per term and
    block, and add their postings to the terms' frequency rows."""
    per_block = BLOCK // SUB
    rows = db.execute(
        f"SELECT term, block, data FROM recall_recent {_W} AND block < ?", (*key, sealed * per_block)
    ).fetchall()
    merged: dict[tuple[str, int], list[tuple[int, bytes]]] = {}
    for term, sub, data in [*rows, *more]:
        merged.setdefault((term, sub // per_block), []).append((sub, bytes(data)))
    # In key order: the upserts sweep each B-tree once (a page read and written once, not
    # once per term that lands on it).
    joined = [
        (term, block, b"".join(d for _, d in sorted(parts, key=lambda p: p[0])))
        for (term, block), parts in sorted(merged.items())
    ]
    db.executemany(
        "INSERT INTO recall_postings (tenant, session_id, term, block, data) VALUES (?, ?, ?, ?, ?)"
        " ON CONFLICT (tenant, session_id, term, block)"
        " DO UPDATE SET data = CAST(data || excluded.data AS BLOB)",
        [(*key, term, block, data) for term, block, data in joined],
    )
    counts: dict[str, int] = {}
    for term, _, data in joined:
        counts[term] = counts.get(term, 0) + len(data) // POSTING.itemsize
    db.executemany(
        "INSERT INTO recall_df (tenant, session_id, term, df) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (tenant, session_id, term) DO UPDATE SET df = df + excluded.df",
        [(*key, term, n) for term, n in counts.items()],
    )
    if rows:
        db.execute(f"DELETE FROM recall_recent {_W} AND block < ?", (*key, sealed * per_block))


def _open_rows(
    db: Db, key: tuple[str, str], terms: Sequence[str], from_block: int, columns: str
) -> list[Any]:
    """``columns`` of the open block's small rows of ``terms`` (from block ``from_block``):
    one primary-key probe per (sub-block, term); only the open block has such rows."""
    current = stats(db, key)
    subs = open_subs(current.indexed_seq, from_block) if current.exists else range(0)
    if not subs or not terms:
        return []
    sub_marks, marks = ",".join("?" * len(subs)), ",".join("?" * len(terms))
    return db.execute(
        f"SELECT {columns} FROM recall_recent {_W} AND block IN ({sub_marks}) AND term IN ({marks})",
        (*key, *subs, *terms),
    ).fetchall()


def postings(
    db: Db, key: tuple[str, str], terms: Sequence[str], from_block: int
) -> dict[str, list[tuple[int, bytes]]]:
    """Sealed rows, then the open block's small rows (as their block), seq order per term
    (caller holds a read transaction: one snapshot)."""
    per_block = BLOCK // SUB
    found: dict[str, list[tuple[int, int, bytes]]] = {}
    for start in range(0, len(terms), 400):
        chunk = list(terms[start : start + 400])
        marks = ",".join("?" * len(chunk))
        for term, block, data in db.execute(
            f"SELECT term, block, data FROM recall_postings {_W} AND term IN ({marks}) AND block >= ?",
            (*key, *chunk, from_block),
        ):
            found.setdefault(term, []).append((block, -1, bytes(data)))
        for term, sub, data in _open_rows(db, key, chunk, from_block, "term, block, data"):
            found.setdefault(term, []).append((sub // per_block, sub, bytes(data)))
    return {term: [(b, d) for b, _, d in sorted(rows)] for term, rows in found.items()}


def term_counts(db: Db, key: tuple[str, str], terms: Sequence[str]) -> dict[str, int]:
    """Layout 2: the frequency row (sealed blocks) plus the open block's small rows; a
    session of layout 1 counts all its postings (caller holds a read transaction)."""
    layout = stats(db, key).layout
    out: dict[str, int] = {}
    for start in range(0, len(terms), 400):
        chunk = list(terms[start : start + 400])
        marks = ",".join("?" * len(chunk))
        if layout >= LAYOUT:
            query = f"SELECT term, df FROM recall_df {_W} AND term IN ({marks})"
        else:
            query = (
                f"SELECT term, SUM(LENGTH(data)) / {POSTING.itemsize} FROM recall_postings {_W}"
                f" AND term IN ({marks}) GROUP BY term"
            )
        for term, df in db.execute(query, (*key, *chunk)):
            out[term] = int(df)
        for term, size in _open_rows(db, key, chunk, 0, "term, LENGTH(data)"):
            out[term] = out.get(term, 0) + size // POSTING.itemsize
    return {term: n for term, n in out.items() if n}


def query_postings(
    db: Db, key: tuple[str, str], terms: Mapping[str, int], capped: Mapping[str, int],
    limits: tuple[int, int],
) -> tuple[dict[str, list[tuple[int, bytes]]], dict[str, int]]:
    """`PostingsStore.query_postings` in the caller's read transaction (one snapshot, one
    trip to the database thread): the capped terms' frequencies, then the rows of the
    terms kept, one query per first block (``limits``: the cap, how many within it)."""
    cap, most = limits
    counts = term_counts(db, key, list(capped)) if capped else {}
    kept = within_cap(capped, counts, cap, most)
    by_start: dict[int, list[str]] = {}
    for term in dict.fromkeys([*terms, *kept]):
        by_start.setdefault(terms.get(term, capped.get(term, 0)), []).append(term)
    found: dict[str, list[tuple[int, bytes]]] = {}
    for start, group in by_start.items():
        found.update(postings(db, key, group, start))
    return found, counts


def convert(db: Db, key: tuple[str, str]) -> None:
    """Give a session indexed at layout 1 its frequency rows, counted over its postings
    rows (the open block's small rows are counted when read; caller holds the write
    transaction, so no append can slip in between the count and the layout)."""
    db.execute(f"DELETE FROM recall_df {_W}", key)
    db.execute(
        "INSERT INTO recall_df (tenant, session_id, term, df) SELECT tenant, session_id, term,"
        f" SUM(LENGTH(data)) / {POSTING.itemsize} FROM recall_postings {_W} GROUP BY term",
        key,
    )
    db.execute(f"UPDATE recall_index SET layout = ? {_W}", (LAYOUT, *key))


def backfill(db: Db, key: tuple[str, str], batch: int) -> int:
    """Index the next ``batch`` turns the index lacks, or convert a session indexed at
    layout 1 (caller holds the write transaction); return the turns done (0 = none left)."""
    row = db.execute(f"SELECT last_seq FROM sessions {_W}", key).fetchone()
    if row is None:
        return 0
    current = stats(db, key)
    done = current.indexed_seq
    converted = 0
    if current.exists and current.layout < LAYOUT:
        convert(db, key)
        converted = done  # its turns count as done in `sessions_to_index`'s progress
    if done >= row[0]:
        if not current.exists:
            db.execute(
                "INSERT INTO recall_index (tenant, session_id, indexed_seq, docs, total_len, layout)"
                " VALUES (?, ?, 0, 0, 0, ?)", (*key, LAYOUT),
            )
        return converted
    turns = [
        turn_row(r)
        for r in db.execute(
            f"{TURN_SELECT} AND t.seq > ? AND t.seq <= ? ORDER BY t.seq", (*key, done, done + batch)
        )
    ]
    if not turns:
        return converted
    _write(db, key, turns, _previous(db, key, done) if done else None)
    return converted + len(turns)


def lagging(db: Db, limit: int) -> list[tuple[str, str, int, int]]:
    """Sessions whose index lags their log, or is of an older layout (counted from 0)."""
    rows = db.execute(
        "SELECT s.tenant, s.session_id, CASE WHEN r.layout < ? THEN 0 ELSE"
        " COALESCE(r.indexed_seq, 0) END, s.last_seq FROM sessions s"
        " LEFT JOIN recall_index r ON r.tenant = s.tenant AND r.session_id = s.session_id"
        " WHERE r.indexed_seq IS NULL OR r.indexed_seq < s.last_seq OR r.layout < ? LIMIT ?",
        (LAYOUT, LAYOUT, limit),
    ).fetchall()
    return [(r[0], r[1], r[2], r[3]) for r in rows]
