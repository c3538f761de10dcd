"""SQLite: kept per-turn traces (`TraceRecords`), as plain functions of a connection.

A trace is kept by reference (`store.trace_pack`): ``turn_traces.body`` holds the packed
trace, ``trace_texts`` the texts it repeats that no turn holds, once per session.
"""

from __future__ import annotations

from .._codec import to_micros
from ..records import TurnTrace
from ..trace_pack import TEXT_TURN_SLACK, PackedTrace, TraceReading, read_trace
from .admin import WHERE, Db, read, write

__all__ = ["delete_traces", "get_trace", "put_trace"]


def put_trace(db: Db, key: tuple[str, str], packed: PackedTrace, keep: int, cutoff: int | None) -> None:
    """Insert or replace the trace and the texts it refers to, then prune by count and age
    (and the texts no kept trace refers to any more, `TEXT_TURN_SLACK`), in one transaction."""

    def body() -> None:
        if db.execute(f"SELECT 1 FROM sessions {WHERE}", key).fetchone() is None:
            return
        db.executemany(
            "INSERT INTO trace_texts (tenant, session_id, key, last_turn, body) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT (tenant, session_id, key) DO UPDATE SET last_turn = excluded.last_turn"
            " WHERE last_turn <= excluded.last_turn - ?",
            [(*key, k, packed.turn, text, TEXT_TURN_SLACK) for k, text in packed.texts.items()],
        )
        db.execute(
            "INSERT OR REPLACE INTO turn_traces (tenant, session_id, turn, created_at, body)"
            " VALUES (?, ?, ?, ?, ?)",
            (*key, packed.turn, to_micros(packed.created_at), packed.body),
        )
        pruned = 0
        if keep:
            pruned += db.execute(
                f"DELETE FROM turn_traces {WHERE} AND turn <= "
                f"(SELECT MAX(turn) FROM turn_traces {WHERE}) - ?",
                (*key, *key, keep),
            ).rowcount
        if cutoff is not None:
            # Traces are written in turn order, so the oldest are the lowest turns: looking at
            # the first few keeps each write O(1) however many traces the session keeps.
            pruned += db.execute(
                f"DELETE FROM turn_traces {WHERE} AND created_at < ? AND turn IN"
                f" (SELECT turn FROM turn_traces {WHERE} ORDER BY turn LIMIT 8)",
                (*key, cutoff, *key),
            ).rowcount
        if pruned:
            db.execute(
                f"DELETE FROM trace_texts {WHERE} AND last_turn <"
                f" (SELECT COALESCE(MIN(turn), 1 << 62) FROM turn_traces {WHERE}) - ?",
                (*key, *key, TEXT_TURN_SLACK),
            )

    write(db, body)


def get_trace(db: Db, key: tuple[str, str], turn: int) -> TurnTrace | None:
    def body() -> TurnTrace | None:
        row = db.execute(f"SELECT body FROM turn_traces {WHERE} AND turn = ?", (*key, turn)).fetchone()
        if row is None:
            return None
        reading = read_trace(row[0])
        if not isinstance(reading, TraceReading):
            return reading
        seqs, keys = sorted(reading.seqs), sorted(reading.keys)
        turns = dict(db.execute(
            f"SELECT seq, content FROM turns {WHERE} AND seq IN ({','.join('?' * len(seqs))})", (*key, *seqs)
        ).fetchall()) if seqs else {}
        texts = dict(db.execute(
            f"SELECT key, body FROM trace_texts {WHERE} AND key IN ({','.join('?' * len(keys))})", (*key, *keys)
        ).fetchall()) if keys else {}
        return reading.rebuild(turns, texts)

    return read(db, body)


def delete_traces(db: Db, key: tuple[str, str]) -> int:
    def body() -> int:
        db.execute(f"DELETE FROM trace_texts {WHERE}", key)
        return int(db.execute(f"DELETE FROM turn_traces {WHERE}", key).rowcount)

    return write(db, body)
