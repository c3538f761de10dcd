"""PostgreSQL side of the lifecycle abilities (`store.lifecycle.Lifecycle`), mixed into `PostgresDriver`.

Erasure deletes the rows of every registered kind in one transaction; the
rows are gone for every reader at commit (dead tuples are reclaimed by
autovacuum; run ``VACUUM`` for the bytes on disk, see docs/lifecycle.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any

from ...errors import StoreError
from .._codec import dumps
from ..lifecycle import SQL_SESSION_TABLES, DeletionRecord, Scope, UserInfo, merge_counts
from ..postings import KeptHeads

__all__ = ["PostgresLifecycle", "erase"]

_W = "WHERE tenant = $1 AND session_id = $2"
_RECORD_COLS = "id, tenant, scope, target, actor, started_at, finished_at, counts::text AS counts"


def _record(row: Any) -> DeletionRecord:
    return DeletionRecord(
        id=row["id"], tenant=row["tenant"], scope=row["scope"], target=row["target"],
        actor=row["actor"], started_at=row["started_at"], finished_at=row["finished_at"],
        counts={k: int(v) for k, v in json.loads(row["counts"]).items()},
    )


async def _add_to_record(db: Any, record_id: int | None, counts: Mapping[str, int]) -> None:
    if record_id is None:
        return
    raw = await db.fetchval("SELECT counts::text FROM deletions WHERE id = $1 FOR UPDATE", record_id)
    if raw is not None:
        merged = merge_counts({k: int(v) for k, v in json.loads(raw).items()}, counts)
        await db.execute("UPDATE deletions SET counts = $2::jsonb WHERE id = $1", record_id, dumps(merged))


async def erase(db: Any, key: tuple[str, str], record_id: int | None) -> dict[str, int]:
    """Delete the session and every registered kind (caller holds a transaction); counts per kind."""
    row = await db.fetchrow(
        f"DELETE FROM sessions {_W} RETURNING summary_version, jsonb_array_length(constraints) AS pins",
        *key,
    )
    counts = {"sessions": int(row is not None), "summaries": int(bool(row and row["summary_version"])),
              "pins": int(row["pins"]) if row else 0}
    for kind in SQL_SESSION_TABLES:
        status = await db.execute(f"DELETE FROM {kind.table} {_W}", *key)
        counts[kind.kind] = counts.get(kind.kind, 0) + int(status.rsplit(" ", 1)[-1])
    await _add_to_record(db, record_id, counts)
    return counts


class PostgresLifecycle:
    """Users, erasure, the deletion log and restore for `PostgresDriver`."""

    _heads: KeptHeads
    """The store's kept index heads (a session's last turn): dropped with what they hold."""

    def _db(self) -> AbstractAsyncContextManager[Any]:
        raise NotImplementedError  # PostgresDriver's own

    async def list_users(self, tenant: str, *, limit: int = 100, offset: int = 0) -> list[UserInfo]:
        async with self._db() as db:
            rows = await db.fetch(
                "SELECT user_id, count(*) AS n, max(updated_at) AS newest FROM sessions"
                " WHERE tenant = $1 AND user_id IS NOT NULL GROUP BY user_id"
                " ORDER BY newest DESC, user_id DESC LIMIT $2 OFFSET $3",
                tenant, limit, offset,
            )
        return [UserInfo(tenant=tenant, user_id=r["user_id"], sessions=r["n"], updated_at=r["newest"])
                for r in rows]

    async def list_tenants(self) -> list[str]:
        async with self._db() as db:
            rows = await db.fetch("SELECT DISTINCT tenant FROM sessions ORDER BY tenant")
        return [r["tenant"] for r in rows]

    async def erase_session(
        self, tenant: str, session_id: str, *, record_id: int | None = None
    ) -> dict[str, int]:
        key = (tenant, session_id)
        self._heads.forget(key)
        async with self._db() as db, db.transaction():
            return await erase(db, key, record_id)

    async def erase_turns_before(
        self, tenant: str, session_id: str, seq: int, *, record_id: int | None = None
    ) -> dict[str, int]:
        key = (tenant, session_id)
        self._heads.forget(key)
        counts: dict[str, int] = {}
        async with self._db() as db, db.transaction():
            for kind in SQL_SESSION_TABLES:
                if kind.per_turn:
                    status = await db.execute(f"DELETE FROM {kind.table} {_W} AND seq < $3", *key, seq)
                    counts[kind.kind] = counts.get(kind.kind, 0) + int(status.rsplit(" ", 1)[-1])
            await _add_to_record(db, record_id, counts)
        return counts

    async def compact(self) -> None:
        return None  # committed deletes are invisible to every reader; VACUUM is the operator's

    async def open_deletion(
        self, tenant: str, scope: Scope, target: str, *, actor: str
    ) -> DeletionRecord:
        async with self._db() as db, db.transaction():
            await db.execute("SELECT pg_advisory_xact_lock(hashtext($1))", f"forget:{tenant}/{scope}/{target}")
            row = await db.fetchrow(
                f"SELECT {_RECORD_COLS} FROM deletions WHERE tenant = $1 AND scope = $2"
                " AND target = $3 AND finished_at IS NULL ORDER BY id LIMIT 1",
                tenant, scope, target,
            )
            if row is None:
                row = await db.fetchrow(
                    "INSERT INTO deletions (tenant, scope, target, actor) VALUES ($1, $2, $3, $4)"
                    f" RETURNING {_RECORD_COLS}",
                    tenant, scope, target, actor,
                )
        return _record(row)

    async def finish_deletion(self, record_id: int, extra: Mapping[str, int]) -> DeletionRecord:
        async with self._db() as db, db.transaction():
            await _add_to_record(db, record_id, extra)
            row = await db.fetchrow(
                "UPDATE deletions SET finished_at = coalesce(finished_at, clock_timestamp())"
                f" WHERE id = $1 RETURNING {_RECORD_COLS}",
                record_id,
            )
        if row is None:
            raise StoreError(f"no deletion record {record_id}")
        return _record(row)

    async def deletions(
        self, *, since_id: int = 0, pending_only: bool = False, limit: int = 100
    ) -> list[DeletionRecord]:
        async with self._db() as db:
            rows = await db.fetch(
                f"SELECT {_RECORD_COLS} FROM deletions WHERE id > $1"
                " AND (NOT $2 OR finished_at IS NULL) ORDER BY id LIMIT $3",
                since_id, pending_only, limit,
            )
        return [_record(r) for r in rows]

    async def restore_session(
        self, tenant: str, session_id: str, *, user_id: str | None,
        created_at: datetime, updated_at: datetime,
    ) -> bool:
        key = (tenant, session_id)
        async with self._db() as db:
            status = await db.execute(
                f"UPDATE sessions SET user_id = $3, created_at = $4, updated_at = $5 {_W}",
                *key, user_id, created_at, updated_at,
            )
        return bool(status == "UPDATE 1")

