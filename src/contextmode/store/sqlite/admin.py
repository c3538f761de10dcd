"""SQLite transactions, session administration and job locks, as plain functions of a connection.

`SQLiteDriver` runs them on its private thread; keeping them here keeps the
store module about the turn log and its derived records.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ...errors import LockNotAcquired
from .._codec import dumps, from_micros, loads_mapping
from ..base import IdempotencyRecord, JobStats, SessionInfo
from ..lifecycle import SQL_SESSION_TABLES, merge_counts

__all__ = [
    "WHERE",
    "Db",
    "acquire_lock",
    "add_to_record",
    "checkpoint",
    "delete_session",
    "erase",
    "list_sessions",
    "purge_idle",
    "read",
    "release_lock",
    "session_info",
    "write",
]

T = TypeVar("T")
Db = sqlite3.Connection

WHERE = "WHERE tenant = ? AND session_id = ?"
_INFO_SELECT = (
    "SELECT session_id, last_seq, created_at, updated_at, summary_covers_seq,"
    " summary_version, constraints_version, user_id FROM sessions"
)


def write(db: Db, body: Callable[[], T]) -> T:
    """Run ``body`` in one ``BEGIN IMMEDIATE`` transaction (all or nothing).

    IMMEDIATE takes the write lock up front: a deferred transaction that reads
    first could fail to upgrade under WAL instead of waiting its turn.
    """
    db.execute("BEGIN IMMEDIATE")
    try:
        result = body()
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
    return result


def read(db: Db, body: Callable[[], T]) -> T:
    """Run ``body`` in one read transaction: one consistent snapshot of the file."""
    db.execute("BEGIN")
    try:
        return body()
    finally:
        db.execute("COMMIT")


def _infos(db: Db, tenant: str, rows: list[Any]) -> list[SessionInfo]:
    jobs: dict[str, dict[str, JobStats]] = {}
    if rows:
        marks = ",".join("?" * len(rows))
        for sid, job, ok, failed, rejected, error, run in db.execute(
            "SELECT session_id, job, ok, failed, rejected, last_error, last_run FROM jobs"
            f" WHERE tenant = ? AND session_id IN ({marks})",
            (tenant, *(r[0] for r in rows)),
        ):
            jobs.setdefault(sid, {})[job] = JobStats(
                ok=ok, failed=failed, rejected=rejected, last_error=error,
                last_run=None if run is None else from_micros(run),
            )
    return [
        SessionInfo(
            tenant=tenant,
            session_id=r[0],
            last_seq=r[1],
            created_at=from_micros(r[2]),
            updated_at=from_micros(r[3]),
            summary_covers_seq=r[4],
            summary_version=r[5],
            constraints_version=r[6],
            jobs=jobs.get(r[0], {}),
            user_id=r[7],
        )
        for r in rows
    ]


def session_info(db: Db, key: tuple[str, str]) -> SessionInfo | None:
    def body() -> SessionInfo | None:
        rows = db.execute(f"{_INFO_SELECT} {WHERE}", key).fetchall()
        return _infos(db, key[0], rows)[0] if rows else None

    return read(db, body)


def list_sessions(
    db: Db, tenant: str, limit: int, offset: int, user_id: str | None = None
) -> list[SessionInfo]:
    def body() -> list[SessionInfo]:
        mine = "" if user_id is None else " AND user_id = ?"
        rows = db.execute(
            f"{_INFO_SELECT} WHERE tenant = ?{mine} ORDER BY updated_at DESC, session_id"
            " LIMIT ? OFFSET ?",
            (tenant, *(() if user_id is None else (user_id,)), limit, offset),
        ).fetchall()
        return _infos(db, tenant, rows)

    return read(db, body)


def add_to_record(db: Db, record_id: int | None, counts: dict[str, int]) -> None:
    """Add ``counts`` to deletion record ``record_id`` (inside the caller's transaction)."""
    if record_id is None:
        return
    row = db.execute("SELECT counts FROM deletions WHERE id = ?", (record_id,)).fetchone()
    if row is not None:
        merged = merge_counts({k: int(v) for k, v in loads_mapping(row[0]).items()}, counts)
        db.execute("UPDATE deletions SET counts = ? WHERE id = ?", (dumps(merged), record_id))


def erase(db: Db, key: tuple[str, str], record_id: int | None = None) -> dict[str, int]:
    """Delete the session and every registered derived kind; counts per kind (in a transaction)."""
    row = db.execute(
        f"SELECT summary_version, json_array_length(constraints) FROM sessions {WHERE}", key
    ).fetchone()
    counts = {"sessions": int(row is not None), "summaries": int(bool(row and row[0])),
              "pins": int(row[1]) if row else 0}
    for kind in SQL_SESSION_TABLES:
        erased = db.execute(f"DELETE FROM {kind.table} {WHERE}", key).rowcount
        counts[kind.kind] = counts.get(kind.kind, 0) + erased
    db.execute(f"DELETE FROM sessions {WHERE}", key)
    add_to_record(db, record_id, counts)
    return counts


def _delete(db: Db, key: tuple[str, str]) -> bool:
    return erase(db, key)["sessions"] == 1


def delete_session(db: Db, key: tuple[str, str]) -> bool:
    deleted = write(db, lambda: _delete(db, key))
    checkpoint(db)
    return deleted


def checkpoint(db: Db, attempts: int = 20) -> bool:
    """Copy the WAL into the file and truncate it to zero bytes; False if readers kept it busy.

    With ``secure_delete`` on, erased rows are zeroed in the pages the checkpoint
    writes back, and the truncated WAL no longer holds their older copies.
    """
    for attempt in range(attempts):
        busy = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        if not busy:
            return True
        time.sleep(0.01 * (attempt + 1))
    return False


def purge_idle(db: Db, cutoff_micros: int) -> int:
    """Delete sessions not updated since the cutoff; also drop locks long expired."""

    def body() -> int:
        idle = db.execute(
            "SELECT tenant, session_id FROM sessions WHERE updated_at < ?", (cutoff_micros,)
        ).fetchall()
        db.execute("DELETE FROM job_locks WHERE expires_at < ?", (time.time(),))
        return sum(_delete(db, (t, s)) for t, s in idle)

    purged = write(db, body)
    if purged:
        checkpoint(db)
    return purged


def acquire_lock(db: Db, key: str, ttl_s: float) -> int:
    """Take the lock if free or expired and return its fencing token, else raise."""

    def body() -> int:
        now = time.time()  # wall clock: shared by every process of the host
        held = db.execute("SELECT expires_at FROM job_locks WHERE key = ?", (key,)).fetchone()
        if held is not None and held[0] > now:
            raise LockNotAcquired(f"job lock {key!r} is held")
        token: int = db.execute(
            "UPDATE fence SET token = token + 1 WHERE id = 1 RETURNING token"
        ).fetchone()[0]
        db.execute(
            "INSERT OR REPLACE INTO job_locks (key, token, expires_at) VALUES (?, ?, ?)",
            (key, token, now + ttl_s),
        )
        return token

    return write(db, body)


def release_lock(db: Db, key: str, token: int) -> None:
    """Release only if the lock still carries ``token`` (an expired holder frees nothing)."""
    db.execute("DELETE FROM job_locks WHERE key = ? AND token = ?", (key, token))


def claim_idempotency(
    db: Db, tenant: str, key: str, fingerprint: str, session_id: str, lease_s: float
) -> IdempotencyRecord | None:
    """Insert a running record for ``key`` (of ``session_id``) unless a live one exists; return the live one."""

    def body() -> IdempotencyRecord | None:
        now = time.time()
        db.execute("DELETE FROM idempotency WHERE expires_at <= ?", (now,))
        row = db.execute(
            "SELECT fingerprint, status, response FROM idempotency WHERE tenant = ? AND key = ?",
            (tenant, key),
        ).fetchone()
        if row is not None:
            return IdempotencyRecord(fingerprint=row[0], status=row[1], response=row[2])
        db.execute(
            "INSERT INTO idempotency (tenant, key, session_id, fingerprint, status, response, expires_at)"
            " VALUES (?, ?, ?, ?, 0, '', ?)",
            (tenant, key, session_id, fingerprint, now + lease_s),
        )
        return None

    return write(db, body)


def finish_idempotency(db: Db, tenant: str, key: str, status: int, response: str, ttl_s: float) -> None:
    db.execute(
        "UPDATE idempotency SET status = ?, response = ?, expires_at = ? WHERE tenant = ? AND key = ?",
        (status, response, time.time() + ttl_s, tenant, key),
    )


def release_idempotency(db: Db, tenant: str, key: str) -> None:
    db.execute("DELETE FROM idempotency WHERE tenant = ? AND key = ?", (tenant, key))
