"""The driver seam: a small core every backend writes, and optional abilities it may add.

A backend is a *driver* of atomic reads and writes on strings the front has checked
(`store.front`). What a new backend must write is the **core**: `Driver` (the turn log, its
derived records, the session listing; 12 methods) and `KeyedRecords` (a blob kept under
``(tenant, kind, key)`` with an expiry, read, compare-and-set and listed by key prefix;
3 methods). 15 methods in all; `store.minimal.MinimalDriver` is the template.

Everything else is an **ability** a driver may have natively, for speed or for a
transaction of its own; the front detects each with ``isinstance`` on its
``runtime_checkable`` Protocol, once, when it is built, and provides the ones a driver lacks
itself on top of the core (`store.kept`):

| ability | methods | without it, the front … |
|---|---|---|
| `ConnectionDriver` | one_connection, let_go | does nothing (no pool to share) |
| `LockDriver` | hold, release | keeps each lock as a keyed record with a TTL and a fencing counter |
| `TurnsAtDriver` | turns_at | reads the range from the lowest to the highest seq and filters |
| `JobDriver` | record_job | keeps each job's counters as a keyed record, shown by ``info`` |
| `TraceDriver` | put_trace, get_trace, delete_traces | keeps each trace's JSON as a keyed record |
| `IdempotencyDriver` | claim/finish/release_idempotency | keeps each key as a keyed record with a TTL |
| `UserDriver` | list_users | groups ``list_sessions`` by user |
| `PurgeDriver` | purge_idle | lists each tenant's sessions and deletes the idle ones |
| `LifecycleDriver` | erase_session, erase_turns_before, compact, the deletion log, restore_session | erases with `Driver.delete` and keeps the deletion log as keyed records; cannot erase a prefix of turns or restore owners and times (`ConfigError`) |

The recall postings (`IndexDriver`) and batched job outcomes (`BatchingDriver`) change what the
store offers callers (recall reads postings only from a store that has them), so they are
picked by the front's class (`IndexedFront`, `BatchingFront`), not detected.

Every shipped backend (memory, SQLite, PostgreSQL, Redis) has every ability natively, so its
front never uses a fallback and none of them needs `KeyedRecords`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Protocol, runtime_checkable

from ..types import Constraint, SessionState, Summary, Turn
from .base import IdempotencyRecord, JobOutcome, LockHandle, SessionInfo, SessionVersion
from .lifecycle import DeletionRecord, Scope, UserInfo
from .postings import AppendInput, IndexStats
from .records import TurnTrace

__all__ = [
    "BatchingDriver",
    "ConnectionDriver",
    "Driver",
    "IdempotencyDriver",
    "IndexDriver",
    "JobDriver",
    "KeyedRecords",
    "LifecycleDriver",
    "LockDriver",
    "PurgeDriver",
    "TraceDriver",
    "TurnsAtDriver",
    "UserDriver",
]


# -- the core: what every backend writes ------------------------------------------------


@runtime_checkable
class Driver(Protocol):
    """A backend's turn log and derived records, each call scoped by a tenant and (most) a
    session id the front has checked. The calls mean what the `Store` protocols say of them."""

    async def close(self) -> None:
        """Release connections and files."""
        ...

    async def append(self, given: AppendInput, *, expected_last_seq: int | None = None) -> list[Turn]:
        """`TurnLog.append` of ``given`` in one atomic step: compare-and-set on the last seq,
        the owner check (`store._codec.check_owner`), the session created if new, the last
        answer set (index terms analysed when the driver keeps postings)."""
        ...

    async def load(
        self,
        tenant: str,
        session_id: str,
        *,
        recent: int = 8,
        max_uncovered: int = 200,
        key_moments: int = 0,
        key_moment_threshold: float = 0.7,
    ) -> SessionState:
        """`TurnLog.load`: the window after the summary (`store._codec.window_start`), the
        pins, the last answer and the strongest older turns."""
        ...

    async def turns(
        self, tenant: str, session_id: str, *, from_seq: int = 1, to_seq: int | None = None
    ) -> list[Turn]:
        """`TurnLog.turns`: a range of the log, oldest first."""
        ...

    async def version(self, tenant: str, session_id: str) -> SessionVersion:
        """`TurnLog.version`: the session's counters and creation time (all 0 when absent)."""
        ...

    async def commit_summary(
        self, tenant: str, session_id: str, summary: Summary, *, expected_version: int
    ) -> bool:
        """`DerivedRecords.commit_summary`: compare-and-set on the summary's version."""
        ...

    async def commit_constraints(
        self,
        tenant: str,
        session_id: str,
        constraints: Sequence[Constraint],
        *,
        expected_version: int,
    ) -> bool:
        """`DerivedRecords.commit_constraints`: compare-and-set on the pins' version."""
        ...

    async def set_emotions(self, tenant: str, session_id: str, scores: Mapping[int, float]) -> None:
        """`DerivedRecords.set_emotions`: scores of existing turns, bumping the emotions version."""
        ...

    async def info(self, tenant: str, session_id: str) -> SessionInfo | None:
        """`SessionAdmin.info` (``jobs`` may be empty: the front adds its kept job counters)."""
        ...

    async def list_sessions(
        self, tenant: str, *, limit: int = 100, offset: int = 0, user_id: str | None = None
    ) -> list[SessionInfo]:
        """`SessionAdmin.list_sessions`: most recently updated first."""
        ...

    async def list_tenants(self) -> list[str]:
        """Every tenant with at least one session, sorted."""
        ...

    async def delete(self, tenant: str, session_id: str) -> bool:
        """Delete the session with its turns and derived records; False if absent."""
        ...


@runtime_checkable
class KeyedRecords(Protocol):
    """Small blobs kept under ``(tenant, kind, key)``, each with an optional expiry: what the
    front keeps the abilities a driver lacks in. Tenant ``""`` holds store-wide records (no
    valid tenant is empty). An expired record reads, lists and swaps as absent."""

    async def get_record(self, tenant: str, kind: str, key: str) -> bytes | None:
        """The record's value, or ``None`` (never written, deleted or expired)."""
        ...

    async def swap_record(
        self,
        tenant: str,
        kind: str,
        key: str,
        old: bytes | None,
        new: bytes | None,
        *,
        ttl_s: float | None = None,
    ) -> bool:
        """Atomically: if the record's value is ``old`` (``None``: absent or expired), make it
        ``new`` (``None``: delete it), kept ``ttl_s`` seconds from now (``None``: until
        changed), and return True; else change nothing and return False."""
        ...

    async def list_records(self, tenant: str, kind: str, prefix: str = "") -> list[tuple[str, bytes]]:
        """The live records of ``(tenant, kind)`` whose key starts with ``prefix``, as
        ``(key, value)`` in key order."""
        ...


# -- optional abilities: native when a backend has them, else the front's (store.kept) ---


@runtime_checkable
class ConnectionDriver(Protocol):
    """`SharesConnection` natively (PostgreSQL's pool)."""

    def one_connection(self) -> AbstractAsyncContextManager[None]: ...
    async def let_go(self) -> None: ...


@runtime_checkable
class LockDriver(Protocol):
    """Job and turn locks natively."""

    def hold(self, key: str, ttl_s: float) -> AbstractAsyncContextManager[LockHandle]:
        """Hold lock ``key`` (the front names it: ``tenant/session``, ``tenant/session#turn``)
        or raise `LockNotAcquired`; it expires ``ttl_s`` after it was taken, and the exit
        releases it if its token still holds it (fencing). Tokens grow across all keys."""
        ...

    async def release(self, handle: LockHandle) -> None:
        """Release a held lock, if its token still holds it."""
        ...


@runtime_checkable
class TurnsAtDriver(Protocol):
    """`TurnsAt` natively: scattered seqs in one read."""

    async def turns_at(self, tenant: str, session_id: str, seqs: Sequence[int]) -> list[Turn]: ...


@runtime_checkable
class JobDriver(Protocol):
    """Job outcome counters kept in the session (and shown by `Driver.info`)."""

    async def record_job(
        self,
        tenant: str,
        session_id: str,
        job: str,
        *,
        ok: bool,
        error: str | None = None,
        rejected: bool = False,
    ) -> None: ...


@runtime_checkable
class TraceDriver(Protocol):
    """`TraceRecords` natively (the shipped backends share texts between traces)."""

    async def put_trace(
        self,
        tenant: str,
        session_id: str,
        trace: TurnTrace,
        *,
        keep: int = 0,
        older_than: datetime | None = None,
    ) -> None: ...
    async def get_trace(self, tenant: str, session_id: str, turn: int) -> TurnTrace | None: ...
    async def delete_traces(self, tenant: str, session_id: str) -> int: ...


@runtime_checkable
class IdempotencyDriver(Protocol):
    """`IdempotencyRecords` natively; a driver with it erases them in `LifecycleDriver`."""

    async def claim_idempotency(
        self, tenant: str, key: str, fingerprint: str, *, session_id: str, lease_s: float
    ) -> IdempotencyRecord | None: ...
    async def finish_idempotency(
        self, tenant: str, key: str, *, status: int, response: str, ttl_s: float
    ) -> None: ...
    async def release_idempotency(self, tenant: str, key: str) -> None: ...


@runtime_checkable
class UserDriver(Protocol):
    """`UserDirectory.list_users` natively (an index by user)."""

    async def list_users(self, tenant: str, *, limit: int = 100, offset: int = 0) -> list[UserInfo]: ...


@runtime_checkable
class PurgeDriver(Protocol):
    """`SessionAdmin.purge_idle` natively (one statement over every tenant)."""

    async def purge_idle(self, older_than: datetime) -> int: ...


@runtime_checkable
class LifecycleDriver(Protocol):
    """Erasure, the deletion log and restore natively: a session erased with every record of
    it and its counts added to the deletion record in one transaction. A driver with it keeps
    its traces, idempotency records and job counters natively too (it erases and counts them)."""

    async def erase_session(
        self, tenant: str, session_id: str, *, record_id: int | None = None
    ) -> dict[str, int]: ...
    async def erase_turns_before(
        self, tenant: str, session_id: str, seq: int, *, record_id: int | None = None
    ) -> dict[str, int]: ...
    async def compact(self) -> None: ...
    async def open_deletion(
        self, tenant: str, scope: Scope, target: str, *, actor: str
    ) -> DeletionRecord: ...
    async def finish_deletion(self, record_id: int, extra: Mapping[str, int]) -> DeletionRecord: ...
    async def deletions(
        self, *, since_id: int = 0, pending_only: bool = False, limit: int = 100
    ) -> list[DeletionRecord]: ...
    async def restore_session(
        self,
        tenant: str,
        session_id: str,
        *,
        user_id: str | None,
        created_at: datetime,
        updated_at: datetime,
    ) -> bool: ...


# -- abilities a front's class offers (not detected) -----------------------------------


class IndexDriver(Driver, Protocol):
    """A driver that keeps the recall postings beside the log (`store.postings`) and reports
    a session's storage (`store.usage`); its front is `IndexedFront`."""

    async def session_bytes(self, tenant: str, session_id: str) -> dict[str, int]: ...
    async def index_stats(self, tenant: str, session_id: str) -> IndexStats: ...
    async def postings(
        self, tenant: str, session_id: str, terms: Sequence[str], *, from_block: int = 0
    ) -> dict[str, list[tuple[int, bytes]]]: ...
    async def term_counts(
        self, tenant: str, session_id: str, terms: Sequence[str]
    ) -> dict[str, int]: ...
    async def query_postings(
        self,
        tenant: str,
        session_id: str,
        terms: Mapping[str, int],
        *,
        capped: Mapping[str, int],
        cap: int,
        most: int,
    ) -> tuple[dict[str, list[tuple[int, bytes]]], dict[str, int]]: ...
    async def index_backfill(self, tenant: str, session_id: str, *, batch: int = 2000) -> int: ...
    async def sessions_to_index(self, *, limit: int = 1000) -> list[tuple[str, str, int, int]]: ...


class BatchingDriver(IndexDriver, Protocol):
    """An indexing driver that counts several job outcomes of a session in one write, releasing
    the job lock in it; its front is `BatchingFront`."""

    async def record_jobs(
        self,
        tenant: str,
        session_id: str,
        outcomes: Sequence[JobOutcome],
        *,
        release: LockHandle | None = None,
    ) -> None: ...
