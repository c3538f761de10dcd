"""SQLite transactions, session administration and job locks, as plain functions of a connection.

`SQLiteStore` runs them on its private thread; keeping them here keeps the
store module about the turn log and its derived records.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import LockNotAcquired
from ._codec import from_micros
from .base import IdempotencyRecord, JobStats, SessionInfo

__all__ = [
    "WHERE",
    "Db",
    "acquire_lock",
    "delete_session",
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
    " summary_version, constraints_version FROM sessions"
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
        )
        for r in rows
    ]


def session_info(db: Db, key: tuple[str, str]) -> SessionInfo | None:
    def body() -> SessionInfo | None:
        rows = db.execute(f"{_INFO_SELECT} {WHERE}", key).fetchall()
        return _infos(db, key[0], rows)[0] if rows else None

    return read(db, body)


def list_sessions(db: Db, tenant: str, limit: int, offset: int) -> list[SessionInfo]:
    def body() -> list[SessionInfo]:
        rows = db.execute(
            f"{_INFO_SELECT} WHERE tenant = ? ORDER BY updated_at DESC, session_id LIMIT ? OFFSET ?",
            (tenant, limit, offset),
        ).fetchall()
        return _infos(db, tenant, rows)

    return read(db, body)


def _delete(db: Db, key: tuple[str, str]) -> bool:
    for table in ("turns", "turn_emotions", "jobs", "recall_postings", "recall_index", "turn_traces"):
        db.execute(f"DELETE FROM {table} {WHERE}", key)
    return db.execute(f"DELETE FROM sessions {WHERE}", key).rowcount == 1


def delete_session(db: Db, key: tuple[str, str]) -> bool:
    return write(db, lambda: _delete(db, key))


def purge_idle(db: Db, cutoff_micros: int) -> int:
    """Delete sessions not updated since the cutoff; also drop locks long expired."""

    def body() -> int:
        idle = db.execute(
            "SELECT tenant, session_id FROM sessions WHERE updated_at < ?", (cutoff_micros,)
        ).fetchall()
        db.execute("DELETE FROM job_locks WHERE expires_at < ?", (time.time(),))
        return sum(_delete(db, (t, s)) for t, s in idle)

    return write(db, body)


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


def claim_idempotency(db: Db, tenant: str, key: str, fingerprint: str, lease_s: float) -> IdempotencyRecord | None:
    """Insert a running record for ``key`` unless a live one exists; return the live one."""

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
            "INSERT INTO idempotency (tenant, key, fingerprint, status, response, expires_at)"
            " VALUES (?, ?, ?, 0, '', ?)",
            (tenant, key, fingerprint, now + lease_s),
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
