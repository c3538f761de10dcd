"""The store front: the one `Store` callers use, over a narrow backend driver.

Callers name a session by a `SessionKey` (checked once, where it was made) and call the
front; the front hands the driver plain, already valid strings. So a backend is a driver
of atomic reads and writes that checks no id itself: the front does what every backend
would otherwise repeat: it checks the tenant of a tenant-wide call and any user id, and names
the session locks (``tenant/session`` for background jobs, ``tenant/session#turn`` for a chat
turn) that a driver only holds and releases (`Driver.hold`, `Driver.release`).

| class | driver protocol | backends |
|---|---|---|
| `StoreFront` | `Driver` | memory (`store.memory`) |
| `IndexedFront` | `IndexDriver` (+ the recall postings and storage usage) | SQLite, Redis |
| `BatchingFront` | `BatchingDriver` (+ several job outcomes in one write) | PostgreSQL |

Each backend's folder (``store/sqlite/``, ``store/postgres/``, ``store/redis/``,
``store/memory/``) holds its driver (``driver.py``) and the front a caller builds
(``SQLiteStore(path)`` is ``IndexedFront(SQLiteDriver(path))``). A fifth backend writes a
driver and picks its front.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Generic, Protocol, TypeVar

from ..types import Constraint, NewTurn, SessionKey, SessionState, Summary, Turn, validate_id
from ._codec import check_user
from .base import (
    ClosesOnExit,
    IdempotencyRecord,
    JobOutcome,
    LockHandle,
    SessionInfo,
    SessionVersion,
)
from .lifecycle import DeletionRecord, Scope, UserInfo
from .postings import AppendInput, IndexStats, append_input
from .records import TurnTrace

__all__ = [
    "BatchingDriver",
    "BatchingFront",
    "Driver",
    "IndexDriver",
    "IndexedFront",
    "StoreFront",
]


class Driver(Protocol):
    """A backend's atomic reads and writes, each scoped by a tenant and (most) a session id
    the front has checked. The calls mean what the `Store` protocols say of them."""

    def one_connection(self) -> AbstractAsyncContextManager[None]: ...
    async def let_go(self) -> None: ...
    async def close(self) -> None: ...
    async def append(self, given: AppendInput, *, expected_last_seq: int | None = None) -> list[Turn]:
        """`TurnLog.append` of ``given`` (ids and user checked; index terms analysed when the
        driver keeps postings)."""
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
    ) -> SessionState: ...
    async def turns(
        self, tenant: str, session_id: str, *, from_seq: int = 1, to_seq: int | None = None
    ) -> list[Turn]: ...
    async def turns_at(self, tenant: str, session_id: str, seqs: Sequence[int]) -> list[Turn]: ...
    async def version(self, tenant: str, session_id: str) -> SessionVersion: ...
    async def commit_summary(
        self, tenant: str, session_id: str, summary: Summary, *, expected_version: int
    ) -> bool: ...
    async def commit_constraints(
        self,
        tenant: str,
        session_id: str,
        constraints: Sequence[Constraint],
        *,
        expected_version: int,
    ) -> bool: ...
    async def set_emotions(
        self, tenant: str, session_id: str, scores: Mapping[int, float]
    ) -> None: ...
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
    async def info(self, tenant: str, session_id: str) -> SessionInfo | None: ...
    async def list_sessions(
        self, tenant: str, *, limit: int = 100, offset: int = 0, user_id: str | None = None
    ) -> list[SessionInfo]: ...
    async def delete(self, tenant: str, session_id: str) -> bool: ...
    async def purge_idle(self, older_than: datetime) -> int: ...
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
    def hold(self, key: str, ttl_s: float) -> AbstractAsyncContextManager[LockHandle]:
        """Hold lock ``key`` (the front names it: ``tenant/session``, ``tenant/session#turn``)
        or raise `LockNotAcquired`; it expires ``ttl_s`` after it was taken, and the exit
        releases it if its token still holds it (fencing)."""
        ...
    async def release(self, handle: LockHandle) -> None:
        """Release a held lock, if its token still holds it."""
        ...
    async def claim_idempotency(
        self, tenant: str, key: str, fingerprint: str, *, session_id: str, lease_s: float
    ) -> IdempotencyRecord | None: ...
    async def finish_idempotency(
        self, tenant: str, key: str, *, status: int, response: str, ttl_s: float
    ) -> None: ...
    async def release_idempotency(self, tenant: str, key: str) -> None: ...
    async def list_users(
        self, tenant: str, *, limit: int = 100, offset: int = 0
    ) -> list[UserInfo]: ...
    async def list_tenants(self) -> list[str]: ...
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


class IndexDriver(Driver, Protocol):
    """A driver that keeps the recall postings beside the log (`store.postings`) and reports
    a session's storage (`store.usage`)."""

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
    """An indexing driver that counts several job outcomes of a session in one write."""

    async def record_jobs(
        self,
        tenant: str,
        session_id: str,
        outcomes: Sequence[JobOutcome],
        *,
        release: LockHandle | None = None,
    ) -> None: ...


def _tenant(tenant: str) -> str:
    return validate_id(tenant, "tenant")


_D = TypeVar("_D", bound=Driver)
_I = TypeVar("_I", bound=IndexDriver)
_B = TypeVar("_B", bound=BatchingDriver)


class StoreFront(ClosesOnExit, Generic[_D]):
    """The `Store` over ``driver``: every session call takes a `SessionKey`."""

    def __init__(self, driver: _D) -> None:
        self.driver = driver
        """The backend's driver (its own knobs and state)."""

    def one_connection(self) -> AbstractAsyncContextManager[None]:
        return self.driver.one_connection()

    async def let_go(self) -> None:
        await self.driver.let_go()

    async def close(self) -> None:
        await self.driver.close()

    async def append(
        self,
        key: SessionKey,
        turns: Sequence[NewTurn],
        *,
        expected_last_seq: int | None = None,
        user_id: str | None = None,
    ) -> list[Turn]:
        given = self.append_input(key, turns, check_user(user_id))
        return await self.driver.append(given, expected_last_seq=expected_last_seq)

    def append_input(
        self, key: SessionKey, turns: Sequence[NewTurn], user_id: str | None
    ) -> AppendInput:
        """What the driver's append takes: a driver without postings needs no index terms."""
        return AppendInput(
            key=(key.tenant, key.session_id), user_id=user_id, turns=list(turns), analyzed={}
        )

    async def load(
        self,
        key: SessionKey,
        *,
        recent: int = 8,
        max_uncovered: int = 200,
        key_moments: int = 0,
        key_moment_threshold: float = 0.7,
    ) -> SessionState:
        return await self.driver.load(
            key.tenant,
            key.session_id,
            recent=recent,
            max_uncovered=max_uncovered,
            key_moments=key_moments,
            key_moment_threshold=key_moment_threshold,
        )

    async def turns(
        self, key: SessionKey, *, from_seq: int = 1, to_seq: int | None = None
    ) -> list[Turn]:
        return await self.driver.turns(key.tenant, key.session_id, from_seq=from_seq, to_seq=to_seq)

    async def turns_at(self, key: SessionKey, seqs: Sequence[int]) -> list[Turn]:
        return await self.driver.turns_at(key.tenant, key.session_id, seqs)

    async def version(self, key: SessionKey) -> SessionVersion:
        return await self.driver.version(key.tenant, key.session_id)

    async def commit_summary(
        self, key: SessionKey, summary: Summary, *, expected_version: int
    ) -> bool:
        return await self.driver.commit_summary(
            key.tenant, key.session_id, summary, expected_version=expected_version
        )

    async def commit_constraints(
        self, key: SessionKey, constraints: Sequence[Constraint], *, expected_version: int
    ) -> bool:
        return await self.driver.commit_constraints(
            key.tenant, key.session_id, constraints, expected_version=expected_version
        )

    async def set_emotions(self, key: SessionKey, scores: Mapping[int, float]) -> None:
        await self.driver.set_emotions(key.tenant, key.session_id, scores)

    async def record_job(
        self,
        key: SessionKey,
        job: str,
        *,
        ok: bool,
        error: str | None = None,
        rejected: bool = False,
    ) -> None:
        await self.driver.record_job(
            key.tenant, key.session_id, job, ok=ok, error=error, rejected=rejected
        )

    async def info(self, key: SessionKey) -> SessionInfo | None:
        return await self.driver.info(key.tenant, key.session_id)

    async def list_sessions(
        self, tenant: str, *, limit: int = 100, offset: int = 0, user_id: str | None = None
    ) -> list[SessionInfo]:
        return await self.driver.list_sessions(
            _tenant(tenant), limit=limit, offset=offset, user_id=check_user(user_id)
        )

    async def delete(self, key: SessionKey) -> bool:
        return await self.driver.delete(key.tenant, key.session_id)

    async def purge_idle(self, older_than: datetime) -> int:
        return await self.driver.purge_idle(older_than)

    async def put_trace(
        self,
        key: SessionKey,
        trace: TurnTrace,
        *,
        keep: int = 0,
        older_than: datetime | None = None,
    ) -> None:
        await self.driver.put_trace(
            key.tenant, key.session_id, trace, keep=keep, older_than=older_than
        )

    async def get_trace(self, key: SessionKey, turn: int) -> TurnTrace | None:
        return await self.driver.get_trace(key.tenant, key.session_id, turn)

    async def delete_traces(self, key: SessionKey) -> int:
        return await self.driver.delete_traces(key.tenant, key.session_id)

    def lock(
        self, key: SessionKey, *, ttl_s: float = 60.0
    ) -> AbstractAsyncContextManager[LockHandle]:
        return self.driver.hold(f"{key.tenant}/{key.session_id}", ttl_s)

    def turn_lock(
        self, key: SessionKey, *, ttl_s: float = 300.0
    ) -> AbstractAsyncContextManager[LockHandle]:
        return self.driver.hold(f"{key.tenant}/{key.session_id}#turn", ttl_s)

    async def release_turn_lock(self, handle: LockHandle) -> None:
        await self.driver.release(handle)

    async def claim_idempotency(
        self, tenant: str, key: str, fingerprint: str, *, session_id: str, lease_s: float
    ) -> IdempotencyRecord | None:
        session = SessionKey(tenant, session_id)
        return await self.driver.claim_idempotency(
            session.tenant, key, fingerprint, session_id=session.session_id, lease_s=lease_s
        )

    async def finish_idempotency(
        self, tenant: str, key: str, *, status: int, response: str, ttl_s: float
    ) -> None:
        await self.driver.finish_idempotency(
            _tenant(tenant), key, status=status, response=response, ttl_s=ttl_s
        )

    async def release_idempotency(self, tenant: str, key: str) -> None:
        await self.driver.release_idempotency(_tenant(tenant), key)

    async def list_users(self, tenant: str, *, limit: int = 100, offset: int = 0) -> list[UserInfo]:
        return await self.driver.list_users(_tenant(tenant), limit=limit, offset=offset)

    async def list_tenants(self) -> list[str]:
        return await self.driver.list_tenants()

    async def erase_session(
        self, key: SessionKey, *, record_id: int | None = None
    ) -> dict[str, int]:
        return await self.driver.erase_session(key.tenant, key.session_id, record_id=record_id)

    async def erase_turns_before(
        self, key: SessionKey, seq: int, *, record_id: int | None = None
    ) -> dict[str, int]:
        return await self.driver.erase_turns_before(
            key.tenant, key.session_id, seq, record_id=record_id
        )

    async def compact(self) -> None:
        await self.driver.compact()

    async def open_deletion(
        self, tenant: str, scope: Scope, target: str, *, actor: str
    ) -> DeletionRecord:
        return await self.driver.open_deletion(_tenant(tenant), scope, target, actor=actor)

    async def finish_deletion(self, record_id: int, extra: Mapping[str, int]) -> DeletionRecord:
        return await self.driver.finish_deletion(record_id, extra)

    async def deletions(
        self, *, since_id: int = 0, pending_only: bool = False, limit: int = 100
    ) -> list[DeletionRecord]:
        return await self.driver.deletions(
            since_id=since_id, pending_only=pending_only, limit=limit
        )

    async def restore_session(
        self, key: SessionKey, *, user_id: str | None, created_at: datetime, updated_at: datetime
    ) -> bool:
        return await self.driver.restore_session(
            key.tenant,
            key.session_id,
            user_id=check_user(user_id),
            created_at=created_at,
            updated_at=updated_at,
        )


class IndexedFront(StoreFront[_I]):
    """`StoreFront` with the recall postings (`store.postings.PostingsStore`) and storage usage."""

    def append_input(
        self, key: SessionKey, turns: Sequence[NewTurn], user_id: str | None
    ) -> AppendInput:
        """The turns' index terms analysed once, before the driver's transaction (its write
        lock is held only to write)."""
        return append_input(key.tenant, key.session_id, turns, user_id)

    async def session_bytes(self, key: SessionKey) -> dict[str, int]:
        return await self.driver.session_bytes(key.tenant, key.session_id)

    async def index_stats(self, key: SessionKey) -> IndexStats:
        return await self.driver.index_stats(key.tenant, key.session_id)

    async def postings(
        self, key: SessionKey, terms: Sequence[str], *, from_block: int = 0
    ) -> dict[str, list[tuple[int, bytes]]]:
        return await self.driver.postings(key.tenant, key.session_id, terms, from_block=from_block)

    async def term_counts(self, key: SessionKey, terms: Sequence[str]) -> dict[str, int]:
        return await self.driver.term_counts(key.tenant, key.session_id, terms)

    async def query_postings(
        self,
        key: SessionKey,
        terms: Mapping[str, int],
        *,
        capped: Mapping[str, int],
        cap: int,
        most: int,
    ) -> tuple[dict[str, list[tuple[int, bytes]]], dict[str, int]]:
        return await self.driver.query_postings(
            key.tenant, key.session_id, terms, capped=capped, cap=cap, most=most
        )

    async def index_backfill(self, key: SessionKey, *, batch: int = 2000) -> int:
        return await self.driver.index_backfill(key.tenant, key.session_id, batch=batch)

    async def sessions_to_index(self, *, limit: int = 1000) -> list[tuple[str, str, int, int]]:
        return await self.driver.sessions_to_index(limit=limit)


class BatchingFront(IndexedFront[_B]):
    """`IndexedFront` that counts several job outcomes in one write (`store.base.JobOutcomes`)."""

    async def record_jobs(
        self, key: SessionKey, outcomes: Sequence[JobOutcome], *, release: LockHandle | None = None
    ) -> None:
        await self.driver.record_jobs(key.tenant, key.session_id, outcomes, release=release)
