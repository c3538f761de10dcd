"""How many bytes a session keeps, by kind of record (``contextmode stats``).

The kinds are those erasure counts (`store.lifecycle.SQL_SESSION_TABLES`,
`REDIS_SESSION_KEYS`) plus ``sessions`` (the session row: heads, summary, pins, last
answer). What is measured is what the backend says a record costs:

- SQLite: the bytes of every column's value (``length()`` of text and blobs, 8 per number),
  without page or index overhead;
- PostgreSQL: ``pg_column_size`` of each row (compressed values, row headers), without
  indexes or dead row versions;
- Redis: ``MEMORY USAGE`` of each of the session's keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard, runtime_checkable

from .._protocols import implements
from ..types import SessionKey
from .lifecycle import REDIS_SESSION_KEYS, SQL_SESSION_TABLES

if TYPE_CHECKING:
    from .base import Store

__all__ = [
    "SQL_KINDS",
    "SessionStorage",
    "StorageUsage",
    "postgres_session_bytes",
    "redis_session_bytes",
    "reports_usage",
    "session_storage",
    "sqlite_session_bytes",
]

SQL_KINDS: tuple[tuple[str, str], ...] = (
    ("sessions", "sessions"), *((k.kind, k.table) for k in SQL_SESSION_TABLES)
)
"""(kind, table) of every SQL table holding a session's records."""


@runtime_checkable
class StorageUsage(Protocol):
    """A store that tells what one session keeps, in bytes, by kind of record."""

    async def session_bytes(self, key: SessionKey) -> Mapping[str, int]:
        """Kind → bytes the session's records of that kind take (kinds with none left out);
        empty for an unknown session."""
        ...


def reports_usage(store: object) -> TypeGuard[StorageUsage]:
    """True when ``store`` reports its size per session (`StorageUsage`)."""
    return implements(store, StorageUsage)


def _add(out: dict[str, int], kind: str, size: int) -> None:
    if size:
        out[kind] = out.get(kind, 0) + size


def sqlite_session_bytes(db: Any, key: tuple[str, str]) -> dict[str, int]:
    """SQLite: the summed value sizes of the session's rows in every table (a ``sqlite3``
    connection; run it inside a read)."""
    out: dict[str, int] = {}
    for kind, table in SQL_KINDS:
        columns = [row[1] for row in db.execute(f"PRAGMA table_info({table})")]
        if not columns:
            continue
        size = " + ".join(f"COALESCE(length(CAST({c} AS BLOB)), 0)" for c in columns)
        row = db.execute(
            f"SELECT SUM({size}) FROM {table} WHERE tenant = ? AND session_id = ?", key
        ).fetchone()
        _add(out, kind, int(row[0] or 0))
    return out


async def postgres_session_bytes(db: Any, key: tuple[str, str]) -> dict[str, int]:
    """PostgreSQL: ``pg_column_size`` of the session's rows in every table (an asyncpg
    connection whose search path is the store's schema)."""
    parts = " UNION ALL ".join(
        f"SELECT '{kind}' AS kind, SUM(pg_column_size(t.*))::bigint AS size FROM {table} t"
        " WHERE t.tenant = $1 AND t.session_id = $2"
        for kind, table in SQL_KINDS
    )
    out: dict[str, int] = {}
    for row in await db.fetch(parts, *key):
        _add(out, row["kind"], int(row["size"] or 0))
    return out


async def redis_session_bytes(client: Any, namespace: str, path: str) -> dict[str, int]:
    """Redis: ``MEMORY USAGE`` of the session's keys (``path`` = ``tenant/session_id``)."""
    kinds = [("sessions", "s"), *((k.kind, k.prefix) for k in REDIS_SESSION_KEYS)]
    out: dict[str, int] = {}
    for kind, prefix in kinds:
        _add(out, kind, int(await client.memory_usage(f"{namespace}{prefix}:{path}", samples=0) or 0))
    return out


@dataclass(frozen=True, kw_only=True)
class SessionStorage:
    """What one session keeps (``contextmode stats``, ``GET /v1/sessions/{id}/storage``)."""

    exchanges: int
    raw_text_bytes: int
    """UTF-8 bytes of both roles' turns as typed and answered."""
    total_bytes: int
    per_exchange: int | None
    bytes: Mapping[str, int]
    """Kind of record → bytes, largest first."""


async def session_storage(store: Store, key: SessionKey) -> SessionStorage:
    """The session's bytes by kind of record, beside its exchanges and raw text; raises
    `UserError` for a store that does not report its size, `SessionNotFound` for an
    unknown session."""
    from ..errors import SessionNotFound, UserError
    from .records import exchange_count

    usage: object = store
    if not reports_usage(usage):
        raise UserError(f"{type(store).__name__} does not report its size per session")
    if await store.info(key) is None:
        raise SessionNotFound(f"no session {key.session_id!r} for tenant {key.tenant!r}")
    kinds = await usage.session_bytes(key)
    turns = await store.turns(key)
    exchanges = exchange_count(turns) or sum(t.role == "user" for t in turns)
    total = sum(kinds.values())
    return SessionStorage(
        exchanges=exchanges,
        raw_text_bytes=sum(len(t.content.encode()) for t in turns),
        total_bytes=total,
        per_exchange=round(total / exchanges) if exchanges else None,
        bytes=dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
    )
