"""SQLite side of the lifecycle abilities (`store.lifecycle.Lifecycle`), mixed into `SQLiteDriver`.

Erasure runs with ``PRAGMA secure_delete`` (set on every connection), so
deleted rows are overwritten with zeros; `compact` then checkpoints the WAL and
truncates it, so no older copy of an erased page stays in the ``-wal`` file.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, TypeVar

from ...errors import StoreError
from .._codec import from_micros, loads_mapping, now_micros, to_micros
from ..lifecycle import SQL_SESSION_TABLES, DeletionRecord, Scope, UserInfo
from .admin import WHERE, add_to_record, checkpoint, erase, read, write

__all__ = ["SQLiteLifecycle"]

T = TypeVar("T")
Db = sqlite3.Connection

_RECORD_COLS = "id, tenant, scope, target, actor, started_at, finished_at, counts"


def _record(row: Any) -> DeletionRecord:
    return DeletionRecord(
        id=row[0], tenant=row[1], scope=row[2], target=row[3], actor=row[4],
        started_at=from_micros(row[5]),
        finished_at=None if row[6] is None else from_micros(row[6]),
        counts={k: int(v) for k, v in loads_mapping(row[7]).items()},
    )


def _erase_before(db: Db, key: tuple[str, str], seq: int, record_id: int | None) -> dict[str, int]:
    counts = {
        kind.kind: db.execute(f"DELETE FROM {kind.table} {WHERE} AND seq < ?", (*key, seq)).rowcount
        for kind in SQL_SESSION_TABLES
        if kind.per_turn
    }
    add_to_record(db, record_id, counts)
    return counts


def _open(db: Db, tenant: str, scope: str, target: str, actor: str) -> DeletionRecord:
    row = db.execute(
        f"SELECT {_RECORD_COLS} FROM deletions WHERE tenant = ? AND scope = ? AND target = ?"
        " AND finished_at IS NULL ORDER BY id LIMIT 1",
        (tenant, scope, target),
    ).fetchone()
    if row is None:
        row = db.execute(
            "INSERT INTO deletions (tenant, scope, target, actor, started_at) VALUES (?, ?, ?, ?, ?)"
            f" RETURNING {_RECORD_COLS}",
            (tenant, scope, target, actor, now_micros()),
        ).fetchone()
    return _record(row)


def _finish(db: Db, record_id: int, extra: Mapping[str, int]) -> DeletionRecord:
    add_to_record(db, record_id, dict(extra))
    db.execute(
        "UPDATE deletions SET finished_at = ? WHERE id = ? AND finished_at IS NULL",
        (now_micros(), record_id),
    )
    row = db.execute(f"SELECT {_RECORD_COLS} FROM deletions WHERE id = ?", (record_id,)).fetchone()
    if row is None:
        raise StoreError(f"no deletion record {record_id}")
    return _record(row)


class SQLiteLifecycle:
    """Users, erasure, the deletion log and restore for `SQLiteDriver`."""

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        raise NotImplementedError  # SQLiteDriver's own

    async def list_users(self, tenant: str, *, limit: int = 100, offset: int = 0) -> list[UserInfo]:

        def body(db: Db) -> list[UserInfo]:
            rows = db.execute(
                "SELECT user_id, count(*), max(updated_at) AS newest FROM sessions"
                " WHERE tenant = ? AND user_id IS NOT NULL GROUP BY user_id"
                " ORDER BY newest DESC, user_id DESC LIMIT ? OFFSET ?",
                (tenant, limit, offset),
            ).fetchall()
            return [UserInfo(tenant=tenant, user_id=u, sessions=n, updated_at=from_micros(t))
                    for u, n, t in rows]

        return await self._run(body)

    async def list_tenants(self) -> list[str]:
        def body(db: Db) -> list[str]:
            return [r[0] for r in db.execute("SELECT DISTINCT tenant FROM sessions ORDER BY tenant")]

        return await self._run(body)

    async def erase_session(
        self, tenant: str, session_id: str, *, record_id: int | None = None
    ) -> dict[str, int]:
        key = (tenant, session_id)
        return await self._run(lambda db: write(db, lambda: erase(db, key, record_id)))

    async def erase_turns_before(
        self, tenant: str, session_id: str, seq: int, *, record_id: int | None = None
    ) -> dict[str, int]:
        key = (tenant, session_id)
        return await self._run(lambda db: write(db, lambda: _erase_before(db, key, seq, record_id)))

    async def compact(self) -> None:
        if not await self._run(checkpoint):
            raise StoreError("the WAL could not be truncated: a reader kept it busy; run forget again")

    async def open_deletion(
        self, tenant: str, scope: Scope, target: str, *, actor: str
    ) -> DeletionRecord:
        return await self._run(lambda db: write(db, lambda: _open(db, tenant, scope, target, actor)))

    async def finish_deletion(self, record_id: int, extra: Mapping[str, int]) -> DeletionRecord:
        return await self._run(lambda db: write(db, lambda: _finish(db, record_id, extra)))

    async def deletions(
        self, *, since_id: int = 0, pending_only: bool = False, limit: int = 100
    ) -> list[DeletionRecord]:
        pending = " AND finished_at IS NULL" if pending_only else ""

        def body(db: Db) -> list[DeletionRecord]:
            rows = db.execute(
                f"SELECT {_RECORD_COLS} FROM deletions WHERE id > ?{pending} ORDER BY id LIMIT ?",
                (since_id, limit),
            ).fetchall()
            return [_record(r) for r in rows]

        return await self._run(lambda db: read(db, lambda: body(db)))

    async def restore_session(
        self, tenant: str, session_id: str, *, user_id: str | None,
        created_at: datetime, updated_at: datetime,
    ) -> bool:
        key = (tenant, session_id)

        def body(db: Db) -> bool:
            cursor = db.execute(
                f"UPDATE sessions SET user_id = ?, created_at = ?, updated_at = ? {WHERE}",
                (user_id, to_micros(created_at), to_micros(updated_at), *key),
            )
            return cursor.rowcount == 1

        return await self._run(body)

