"""The store front: the one `Store` callers use, over a narrow backend driver.

Callers name a session by a `SessionKey` (checked once, where it was made) and call the
front; the front hands the driver plain, already valid strings. So a backend is a driver
of atomic reads and writes that checks no id itself: the front does what every backend
would otherwise repeat: it checks the tenant of a tenant-wide call and any user id, and names
the session locks (``tenant/session`` for background jobs, ``tenant/session#turn`` for a chat
turn) that a driver only holds and releases (`LockDriver.hold`, `LockDriver.release`).

The driver seam (`store.drivers`) is a core every backend writes (`Driver` and
`KeyedRecords`: 15 methods) and optional abilities (traces, idempotency, locks, lifecycle…)
a backend may have natively; the front checks each once, when it is built, and provides the
ones a driver lacks on the core (`store.kept`).

| class | driver protocol | backends |
|---|---|---|
| `StoreFront` | `Driver` (+ `KeyedRecords` for the abilities it lacks) | memory (`store.memory`), the template (`store.minimal`) |
| `IndexedFront` | `IndexDriver` (+ the recall postings and storage usage) | SQLite, Redis |
| `BatchingFront` | `BatchingDriver` (+ several job outcomes in one write) | PostgreSQL |

Each backend's folder (``store/sqlite/``, ``store/postgres/``, ``store/redis/``,
``store/memory/``) holds its driver (``driver.py``) and the front a caller builds
(``SQLiteStore(path)`` is ``IndexedFront(SQLiteDriver(path))``). A fifth backend writes a
driver (`store.minimal.MinimalDriver` is the template) and picks its front.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import replace
from datetime import datetime
from typing import Generic, TypeVar

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
from .drivers import (
    BatchingDriver,
    ConnectionDriver,
    Driver,
    IdempotencyDriver,
    IndexDriver,
    JobDriver,
    KeyedRecords,
    LifecycleDriver,
    LockDriver,
    PurgeDriver,
    TraceDriver,
    TurnsAtDriver,
    UserDriver,
)
from .kept import (
    DropsNativeTraces,
    DropsSession,
    RecordIdempotency,
    RecordJobs,
    RecordLifecycle,
    RecordLocks,
    Records,
    RecordTraces,
    list_users_by_sessions,
    purge_by_listing,
    turns_at_by_range,
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
    "records_for",
]

_KEPT_ABILITIES: tuple[type, ...] = (LockDriver, JobDriver, TraceDriver, IdempotencyDriver, LifecycleDriver)
"""The abilities the front keeps in a driver's `KeyedRecords` when the driver lacks them."""


def records_for(driver: Driver) -> Records | None:
    """The records the front keeps ``driver``'s missing abilities in (``None``: it lacks
    none); `TypeError` when it lacks some and keeps no `KeyedRecords`, or when its abilities
    do not fit together (a native erasure must erase native traces, idempotency records and
    job counters; native idempotency records need a native erasure)."""
    name = type(driver).__name__
    missing = [ability.__name__ for ability in _KEPT_ABILITIES if not isinstance(driver, ability)]
    if isinstance(driver, LifecycleDriver) and missing:
        raise TypeError(f"{name} erases sessions itself (LifecycleDriver) but lacks {', '.join(missing)}")
    if isinstance(driver, IdempotencyDriver) and not isinstance(driver, LifecycleDriver):
        raise TypeError(f"{name} keeps idempotency records itself but has no LifecycleDriver to erase them")
    if not missing:
        return None
    if not isinstance(driver, KeyedRecords):
        raise TypeError(f"{name} lacks {', '.join(missing)} and has no KeyedRecords to keep them in")
    return Records(driver)


def _kept(records: Records | None) -> Records:
    if records is None:  # records_for returned None: the driver lacks no such ability
        raise TypeError("the driver's abilities changed after its front checked them")
    return records


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
        records = records_for(driver)
        drops: list[DropsSession] = []
        self._connection = driver if isinstance(driver, ConnectionDriver) else None
        self._locks: LockDriver = driver if isinstance(driver, LockDriver) else RecordLocks(_kept(records))
        self._turns_at = driver if isinstance(driver, TurnsAtDriver) else None
        self._users = driver if isinstance(driver, UserDriver) else None
        self._kept_jobs: RecordJobs | None = None
        """The job counters the front keeps (``info`` shows them), when the driver has none."""
        self._jobs: JobDriver
        if isinstance(driver, JobDriver):
            self._jobs = driver
        else:
            self._jobs = self._kept_jobs = RecordJobs(_kept(records), driver)
            drops.append(self._kept_jobs)
        self._traces: TraceDriver
        if isinstance(driver, TraceDriver):
            self._traces = driver
        else:
            self._traces = kept_traces = RecordTraces(_kept(records), driver)
            drops.append(kept_traces)
        self._idempotency: IdempotencyDriver
        if isinstance(driver, IdempotencyDriver):
            self._idempotency = driver
        else:
            self._idempotency = kept_idempotency = RecordIdempotency(_kept(records))
            drops.append(kept_idempotency)
        self._drops = tuple(drops)
        """What the front keeps of a session itself: erased before the session."""
        self._purge = driver if isinstance(driver, PurgeDriver) and not drops else None
        self._lifecycle: LifecycleDriver
        if isinstance(driver, LifecycleDriver):
            self._lifecycle = driver
        else:
            native: list[DropsSession] = [DropsNativeTraces(driver)] if isinstance(driver, TraceDriver) else []
            self._lifecycle = RecordLifecycle(_kept(records), driver, [*drops, *native])

    def one_connection(self) -> AbstractAsyncContextManager[None]:
        return self._connection.one_connection() if self._connection is not None else nullcontext()

    async def let_go(self) -> None:
        if self._connection is not None:
            await self._connection.let_go()

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
        if self._turns_at is None:
            return await turns_at_by_range(self.driver, key.tenant, key.session_id, seqs)
        return await self._turns_at.turns_at(key.tenant, key.session_id, seqs)

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
        await self._jobs.record_job(
            key.tenant, key.session_id, job, ok=ok, error=error, rejected=rejected
        )

    async def _with_jobs(self, info: SessionInfo) -> SessionInfo:
        """``info`` with the job counters the front keeps, when it keeps them."""
        if self._kept_jobs is None:
            return info
        jobs = await self._kept_jobs.jobs(info.tenant, info.session_id, info.created_at)
        return replace(info, jobs=jobs)

    async def info(self, key: SessionKey) -> SessionInfo | None:
        info = await self.driver.info(key.tenant, key.session_id)
        return info if info is None or self._kept_jobs is None else await self._with_jobs(info)

    async def list_sessions(
        self, tenant: str, *, limit: int = 100, offset: int = 0, user_id: str | None = None
    ) -> list[SessionInfo]:
        listed = await self.driver.list_sessions(
            _tenant(tenant), limit=limit, offset=offset, user_id=check_user(user_id)
        )
        return listed if self._kept_jobs is None else [await self._with_jobs(i) for i in listed]

    async def _delete(self, tenant: str, session_id: str) -> bool:
        """Delete the session: the records the front keeps of it first, then the session."""
        for drops in self._drops:
            await drops.drop_session(tenant, session_id)
        return await self.driver.delete(tenant, session_id)

    async def delete(self, key: SessionKey) -> bool:
        return await self._delete(key.tenant, key.session_id)

    async def purge_idle(self, older_than: datetime) -> int:
        if self._purge is None:
            return await purge_by_listing(self.driver, older_than, self._delete)
        return await self._purge.purge_idle(older_than)

    async def put_trace(
        self,
        key: SessionKey,
        trace: TurnTrace,
        *,
        keep: int = 0,
        older_than: datetime | None = None,
    ) -> None:
        await self._traces.put_trace(
            key.tenant, key.session_id, trace, keep=keep, older_than=older_than
        )

    async def get_trace(self, key: SessionKey, turn: int) -> TurnTrace | None:
        return await self._traces.get_trace(key.tenant, key.session_id, turn)

    async def delete_traces(self, key: SessionKey) -> int:
        return await self._traces.delete_traces(key.tenant, key.session_id)

    def lock(
        self, key: SessionKey, *, ttl_s: float = 60.0
    ) -> AbstractAsyncContextManager[LockHandle]:
        return self._locks.hold(f"{key.tenant}/{key.session_id}", ttl_s)

    def turn_lock(
        self, key: SessionKey, *, ttl_s: float = 300.0
    ) -> AbstractAsyncContextManager[LockHandle]:
        return self._locks.hold(f"{key.tenant}/{key.session_id}#turn", ttl_s)

    async def release_turn_lock(self, handle: LockHandle) -> None:
        await self._locks.release(handle)

    async def claim_idempotency(
        self, tenant: str, key: str, fingerprint: str, *, session_id: str, lease_s: float
    ) -> IdempotencyRecord | None:
        session = SessionKey(tenant, session_id)
        return await self._idempotency.claim_idempotency(
            session.tenant, key, fingerprint, session_id=session.session_id, lease_s=lease_s
        )

    async def finish_idempotency(
        self, tenant: str, key: str, *, status: int, response: str, ttl_s: float
    ) -> None:
        await self._idempotency.finish_idempotency(
            _tenant(tenant), key, status=status, response=response, ttl_s=ttl_s
        )

    async def release_idempotency(self, tenant: str, key: str) -> None:
        await self._idempotency.release_idempotency(_tenant(tenant), key)

    async def list_users(self, tenant: str, *, limit: int = 100, offset: int = 0) -> list[UserInfo]:
        if self._users is None:
            return await list_users_by_sessions(self.driver, _tenant(tenant), limit=limit, offset=offset)
        return await self._users.list_users(_tenant(tenant), limit=limit, offset=offset)

    async def list_tenants(self) -> list[str]:
        return await self.driver.list_tenants()

    async def erase_session(
        self, key: SessionKey, *, record_id: int | None = None
    ) -> dict[str, int]:
        return await self._lifecycle.erase_session(key.tenant, key.session_id, record_id=record_id)

    async def erase_turns_before(
        self, key: SessionKey, seq: int, *, record_id: int | None = None
    ) -> dict[str, int]:
        return await self._lifecycle.erase_turns_before(
            key.tenant, key.session_id, seq, record_id=record_id
        )

    async def compact(self) -> None:
        await self._lifecycle.compact()

    async def open_deletion(
        self, tenant: str, scope: Scope, target: str, *, actor: str
    ) -> DeletionRecord:
        return await self._lifecycle.open_deletion(_tenant(tenant), scope, target, actor=actor)

    async def finish_deletion(self, record_id: int, extra: Mapping[str, int]) -> DeletionRecord:
        return await self._lifecycle.finish_deletion(record_id, extra)

    async def deletions(
        self, *, since_id: int = 0, pending_only: bool = False, limit: int = 100
    ) -> list[DeletionRecord]:
        return await self._lifecycle.deletions(
            since_id=since_id, pending_only=pending_only, limit=limit
        )

    async def restore_session(
        self, key: SessionKey, *, user_id: str | None, created_at: datetime, updated_at: datetime
    ) -> bool:
        return await self._lifecycle.restore_session(
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
