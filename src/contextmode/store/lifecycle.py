"""Data lifecycle abilities of a store: users, erasure with an audit trail, restore.

Every backend (memory, SQLite, PostgreSQL, Redis) implements `Lifecycle`, three
small protocols beside the `Store` seam:

- `UserDirectory`: which users and tenants have sessions;
- `Erasure`: erase one session with every record derived from it, counted per
  kind, inside one transaction that also adds the counts to a deletion record;
- `DeletionLog`: those records (who, when, what scope, counts: never content)
  form the audit log and the work list that makes a forget resumable;
- `Restore`: put back a session's owner and times (import, migrate).

**Derived record kinds.** What erasing a session removes is listed once per
store family, in `SQL_SESSION_TABLES` (SQLite and PostgreSQL) and
`REDIS_SESSION_KEYS` (Redis): a new table or key family that holds anything of
a session's turns is erased, and counted, by adding one line there. See
docs/lifecycle.md, "Adding a derived record kind".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, Protocol, TypeGuard, runtime_checkable

from .._protocols import implements
from ..types import SessionKey
from .base import Store

__all__ = [
    "REDIS_SESSION_KEYS",
    "SQL_SESSION_TABLES",
    "DeletionLog",
    "DeletionRecord",
    "Erasure",
    "Lifecycle",
    "LifecycleStore",
    "RedisKind",
    "Restore",
    "Scope",
    "SqlKind",
    "UserDirectory",
    "UserInfo",
    "is_lifecycle_store",
    "merge_counts",
]

Scope = Literal["session", "user", "tenant", "retention"]
"""What a deletion record erases: one session, every session of a user, a whole
tenant, or what a retention policy expired."""


@dataclass(frozen=True, kw_only=True)
class SqlKind:
    """A table holding records of a session, keyed by ``tenant`` and ``session_id``."""

    kind: str
    """Name in the counts a forget returns (``turns``, ``emotion_scores``…)."""
    table: str
    """Table name, the same in SQLite and PostgreSQL."""
    per_turn: bool = False
    """The table has a ``seq`` column: retention's turn limit prunes its old rows too."""


@dataclass(frozen=True, kw_only=True)
class RedisKind:
    """A Redis key of a session: ``{namespace}{prefix}:{tenant}/{session_id}``."""

    kind: str
    """Name in the counts a forget returns."""
    prefix: str
    """Key prefix after the namespace (``t`` for ``cm:t:tenant/session``)."""
    count_fields: str = ""
    """For a hash holding several fields per record: count only fields starting with this."""
    lists_keys: bool = False
    """A set whose members are names of keys holding this session's records (kept
    apart, e.g. per tenant): erasing deletes each listed key whose JSON value names
    this ``session_id`` and counts those keys, then the set."""


# -- the registry: one line per derived record kind -------------------------------
# The ``sessions`` row / hash itself (summary, pins, last answer, owner) is erased
# last by every backend and counted as ``sessions``, ``summaries`` and ``pins``.
# To plug in a new table: add ``SqlKind(kind=..., table=...)`` here (the table must
# have ``tenant`` and ``session_id`` columns), or a ``RedisKind`` for a Redis key.
# Several tables may share a kind: their counts add up.
SQL_SESSION_TABLES: tuple[SqlKind, ...] = (
    SqlKind(kind="turns", table="turns", per_turn=True),
    SqlKind(kind="emotion_scores", table="turn_emotions", per_turn=True),
    SqlKind(kind="job_stats", table="jobs"),
    SqlKind(kind="recall_postings", table="recall_postings"),
    SqlKind(kind="recall_index", table="recall_index"),
    SqlKind(kind="recall_postings", table="recall_recent"),  # the open block's rows
    SqlKind(kind="recall_df", table="recall_df"),
    SqlKind(kind="traces", table="turn_traces"),
    SqlKind(kind="trace_texts", table="trace_texts"),
    SqlKind(kind="idempotency", table="idempotency"),
)
REDIS_SESSION_KEYS: tuple[RedisKind, ...] = (
    RedisKind(kind="turns", prefix="t"),
    RedisKind(kind="emotion_scores", prefix="e"),
    RedisKind(kind="job_stats", prefix="j", count_fields="run:"),
    RedisKind(kind="traces", prefix="tr"),
    RedisKind(kind="trace_turns", prefix="trn"),
    RedisKind(kind="trace_ages", prefix="tra"),
    RedisKind(kind="trace_texts", prefix="trx"),
    RedisKind(kind="trace_texts_turns", prefix="trxl"),
    RedisKind(kind="idempotency", prefix="idk", lists_keys=True),
    RedisKind(kind="recall_postings", prefix="rp"),
    RedisKind(kind="recall_index", prefix="ri", count_fields="indexed_seq"),
)


@dataclass(frozen=True, kw_only=True)
class UserInfo:
    """A user of a tenant, as listed."""

    tenant: str
    user_id: str
    sessions: int
    """How many sessions name this user."""
    updated_at: datetime
    """Newest ``updated_at`` of those sessions."""


@dataclass(frozen=True, kw_only=True)
class DeletionRecord:
    """One forget, for audit: who asked, when, what scope, how much went. No content."""

    id: int
    tenant: str
    scope: Scope
    target: str
    """The session id, user id or tenant erased (``*`` for retention)."""
    actor: str
    """Who asked: ``api:<tenant>``, ``cli``, ``library``, ``retention``."""
    started_at: datetime
    finished_at: datetime | None = None
    """``None`` while the forget is under way (or was cut off: resume it)."""
    counts: Mapping[str, int] = field(default_factory=dict)
    """Records erased per kind (``sessions``, ``turns``, ``summaries``, ``pins``…)."""

    @property
    def pending(self) -> bool:
        return self.finished_at is None


def merge_counts(into: dict[str, int], more: Mapping[str, int]) -> dict[str, int]:
    """Add ``more`` to ``into`` key by key (in place) and return ``into``."""
    for kind, count in more.items():
        into[kind] = into.get(kind, 0) + int(count)
    return into


@runtime_checkable
class UserDirectory(Protocol):
    async def list_users(self, tenant: str, *, limit: int = 100, offset: int = 0) -> list[UserInfo]:
        """The tenant's users with at least one session, most recently active first."""
        ...

    async def list_tenants(self) -> list[str]:
        """Every tenant with at least one session, sorted."""
        ...


@runtime_checkable
class Erasure(Protocol):
    async def erase_session(
        self, key: SessionKey, *, record_id: int | None = None
    ) -> dict[str, int]:
        """Erase the session and every derived record of it in one transaction.

        Returns the counts per kind (all zero for an absent session: idempotent);
        with ``record_id`` the counts are added to that deletion record in the
        same transaction, so a crash never loses or double-counts them.
        """
        ...

    async def erase_turns_before(
        self, key: SessionKey, seq: int, *, record_id: int | None = None
    ) -> dict[str, int]:
        """Erase the session's turns (and per-turn records) with ``seq`` < ``seq`` (retention)."""
        ...

    async def compact(self) -> None:
        """Make erased bytes unreadable from the backend's files (SQLite: truncate the WAL)."""
        ...


@runtime_checkable
class DeletionLog(Protocol):
    async def open_deletion(
        self, tenant: str, scope: Scope, target: str, *, actor: str
    ) -> DeletionRecord:
        """Start a deletion record, or return the unfinished one with the same scope and target."""
        ...

    async def finish_deletion(self, record_id: int, extra: Mapping[str, int]) -> DeletionRecord:
        """Add ``extra`` counts (caches, files) and mark the record finished."""
        ...

    async def deletions(
        self, *, since_id: int = 0, pending_only: bool = False, limit: int = 100
    ) -> list[DeletionRecord]:
        """Deletion records with ``id`` > ``since_id``, oldest first."""
        ...


@runtime_checkable
class Restore(Protocol):
    async def restore_session(
        self, key: SessionKey, *, user_id: str | None,
        created_at: datetime, updated_at: datetime,
    ) -> bool:
        """Set an existing session's owner and times (import, migrate); False if absent."""
        ...


@runtime_checkable
class Lifecycle(UserDirectory, Erasure, DeletionLog, Restore, Protocol):
    """Every lifecycle ability; all four shipped stores have them."""


@runtime_checkable
class LifecycleStore(Store, Lifecycle, Protocol):
    """A `Store` with every lifecycle ability."""


def is_lifecycle_store(store: object) -> TypeGuard[LifecycleStore]:
    """True when ``store`` can list users, erase with an audit record and restore."""
    return implements(store, Lifecycle)
