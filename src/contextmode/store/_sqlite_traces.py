"""SQLite: kept per-turn traces (`TraceRecords`), as plain functions of a connection."""

from __future__ import annotations

from ..trace import TurnTrace, trace_from_json, trace_to_json
from ._codec import to_micros
from ._sqlite_admin import WHERE, Db, read, write

__all__ = ["delete_traces", "get_trace", "put_trace"]


def put_trace(db: Db, key: tuple[str, str], trace: TurnTrace, keep: int, cutoff: int | None) -> None:
    """Insert or replace the trace, then prune by count and age, in one transaction."""

    def body() -> None:
        if db.execute(f"SELECT 1 FROM sessions {WHERE}", key).fetchone() is None:
            return
        db.execute(
            "INSERT OR REPLACE INTO turn_traces (tenant, session_id, turn, created_at, body)"
            " VALUES (?, ?, ?, ?, ?)",
            (*key, trace.turn, to_micros(trace.created_at), trace_to_json(trace)),
        )
        if keep:
            db.execute(
                f"DELETE FROM turn_traces {WHERE} AND turn <= "
                f"(SELECT MAX(turn) FROM turn_traces {WHERE}) - ?",
                (*key, *key, keep),
            )
        if cutoff is not None:
            # Traces are written in turn order, so the oldest are the lowest turns: looking at
            # the first few keeps each write O(1) however many traces the session keeps.
            db.execute(
                f"DELETE FROM turn_traces {WHERE} AND created_at < ? AND turn IN"
                f" (SELECT turn FROM turn_traces {WHERE} ORDER BY turn LIMIT 8)",
                (*key, cutoff, *key),
            )

    write(db, body)


def get_trace(db: Db, key: tuple[str, str], turn: int) -> TurnTrace | None:
    row = read(
        db,
        lambda: db.execute(f"SELECT body FROM turn_traces {WHERE} AND turn = ?", (*key, turn)).fetchone(),
    )
    return trace_from_json(row[0]) if row else None


def delete_traces(db: Db, key: tuple[str, str]) -> int:
    return write(db, lambda: db.execute(f"DELETE FROM turn_traces {WHERE}", key).rowcount)
