"""The abilities the store front provides itself, on a driver's core, when the driver lacks them.

Each class here has the methods of one optional driver ability (`store.drivers`) and keeps its
data through the driver's `KeyedRecords` (a blob under ``(tenant, kind, key)`` with an
expiry, swapped by compare-and-set), so a new backend writes only the core and passes the
store contract. The shipped backends have every ability natively and never use these.

What the fallbacks promise less than a native ability (docs/storage.md, "Writing a backend"):
they are not one transaction with the session's own writes. A session's records go before
the session itself (a crash leaves a session missing some derived records, never records that
outlive it), and job counters and traces are keyed by the session's creation time, so a
session deleted and created again never sees the records of the one before.

Record kinds (the ``kind`` of `KeyedRecords`), keys after the session id and ``/``:

| kind | tenant | key | value |
|---|---|---|---|
| ``lock`` / ``lock-fence`` | ``""`` | lock name / ``""`` | fencing token (decimal) |
| ``job`` | tenant | ``session/created/job`` | JSON counters |
| ``trace`` / ``trace-age`` | tenant | ``session/created/turn`` (10 digits) | trace JSON / its creation (µs) |
| ``idempotency`` | tenant | the key | JSON record (with its session) |
| ``idempotency-of`` | tenant | ``session/key`` | empty: the session's keys, for erasure |
| ``deletion`` / ``deletion-open`` / ``deletion-next`` | ``""`` | id (12 digits) / ``tenant/scope/target`` / ``""`` | JSON record / its id / the last id |
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import datetime
from typing import Any, Protocol, cast, get_args

from ..errors import ConfigError, InputError, LockNotAcquired
from ..types import Turn, utc_now
from ._codec import dumps, to_micros
from .base import IdempotencyRecord, JobStats, LockHandle
from .drivers import Driver, KeyedRecords, TraceDriver
from .lifecycle import DeletionRecord, Scope, UserInfo, merge_counts
from .records import TurnTrace, trace_from_json, trace_to_json

__all__ = [
    "DropsNativeTraces",
    "DropsSession",
    "RecordIdempotency",
    "RecordJobs",
    "RecordLifecycle",
    "RecordLocks",
    "RecordTraces",
    "Records",
    "list_users_by_sessions",
    "purge_by_listing",
    "turns_at_by_range",
]

_PAGE = 500
"""Sessions read per `Driver.list_sessions` call when a fallback walks a tenant."""

_STORE = ""
"""The tenant of store-wide records."""


class Records:
    """`KeyedRecords` with the few writes the fallbacks build on its compare-and-set."""

    def __init__(self, raw: KeyedRecords) -> None:
        self.raw = raw

    async def update(
        self,
        tenant: str,
        kind: str,
        key: str,
        change: Callable[[bytes | None], bytes | None],
        *,
        ttl_s: float | None = None,
    ) -> bytes | None:
        """Swap the record for ``change(value)`` until no other writer came in between;
        the value written."""
        while True:
            old = await self.raw.get_record(tenant, kind, key)
            new = change(old)
            if await self.raw.swap_record(tenant, kind, key, old, new, ttl_s=ttl_s):
                return new

    async def put(
        self, tenant: str, kind: str, key: str, value: bytes, *, ttl_s: float | None = None
    ) -> None:
        await self.update(tenant, kind, key, lambda _: value, ttl_s=ttl_s)

    async def drop(self, tenant: str, kind: str, key: str) -> bool:
        """Delete the record; False if there was none."""
        while True:
            old = await self.raw.get_record(tenant, kind, key)
            if old is None:
                return False
            if await self.raw.swap_record(tenant, kind, key, old, None):
                return True

    async def drop_prefix(self, tenant: str, kind: str, prefix: str) -> int:
        """Delete every record whose key starts with ``prefix``; how many went."""
        listed = await self.raw.list_records(tenant, kind, prefix)
        return sum([await self.drop(tenant, kind, key) for key, _ in listed])


def _json(data: bytes) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(data)
    return loaded


def _generation(created_at: datetime) -> str:
    """A session's incarnation in record keys: its creation time, microseconds."""
    return str(to_micros(created_at))


class DropsSession(Protocol):
    """A fallback keeping records of a session: erases them when the session goes."""

    async def drop_session(self, tenant: str, session_id: str) -> dict[str, int]:
        """Delete the session's records (every incarnation); counts per kind."""
        ...


# -- locks ------------------------------------------------------------------------------


class RecordLocks:
    """`LockDriver` on records: a lock is a record holding its fencing token, kept ``ttl_s``;
    tokens come from one store-wide counter, so they grow across every lock."""

    def __init__(self, records: Records) -> None:
        self._records = records

    async def _next_token(self) -> int:
        written = await self._records.update(
            _STORE, "lock-fence", "", lambda old: str(int(old or b"0") + 1).encode()
        )
        return int(written or b"0")

    @asynccontextmanager
    async def hold(self, key: str, ttl_s: float) -> AsyncIterator[LockHandle]:
        token = await self._next_token()
        if not await self._records.raw.swap_record(
            _STORE, "lock", key, None, str(token).encode(), ttl_s=ttl_s
        ):
            raise LockNotAcquired(f"lock {key!r} is held")
        handle = LockHandle(key=key, token=token)
        try:
            yield handle
        finally:
            await self.release(handle)

    async def release(self, handle: LockHandle) -> None:
        await self._records.raw.swap_record(
            _STORE, "lock", handle.key, str(handle.token).encode(), None
        )


# -- job counters ---------------------------------------------------------------------


def _stats_json(stats: JobStats) -> bytes:
    last_run = stats.last_run.isoformat() if stats.last_run else None
    return dumps({"ok": stats.ok, "failed": stats.failed, "rejected": stats.rejected,
                  "last_error": stats.last_error, "last_run": last_run}).encode()


def _stats(data: bytes) -> JobStats:
    raw = _json(data)
    last_run = raw.get("last_run")
    return JobStats(ok=int(raw["ok"]), failed=int(raw["failed"]), rejected=int(raw["rejected"]),
                    last_error=raw.get("last_error"),
                    last_run=datetime.fromisoformat(last_run) if last_run else None)


class RecordJobs:
    """`JobDriver` on records: one record of counters per (session, job)."""

    def __init__(self, records: Records, driver: Driver) -> None:
        self._records, self._driver = records, driver

    async def record_job(
        self, tenant: str, session_id: str, job: str, *, ok: bool, error: str | None = None,
        rejected: bool = False,
    ) -> None:
        created = (await self._driver.version(tenant, session_id)).created_at
        if created is None:
            return

        def count(old: bytes | None) -> bytes:
            stats = _stats(old) if old is not None else JobStats()
            return _stats_json(JobStats(
                ok=stats.ok + ok,
                failed=stats.failed + (not ok and not rejected),
                rejected=stats.rejected + (not ok and rejected),
                last_error=None if ok else error,
                last_run=utc_now(),
            ))

        await self._records.update(tenant, "job", f"{session_id}/{_generation(created)}/{job}", count)

    async def jobs(self, tenant: str, session_id: str, created_at: datetime) -> dict[str, JobStats]:
        """The counters of the session created at ``created_at``, by job."""
        prefix = f"{session_id}/{_generation(created_at)}/"
        listed = await self._records.raw.list_records(tenant, "job", prefix)
        return {key[len(prefix):]: _stats(value) for key, value in listed}

    async def drop_session(self, tenant: str, session_id: str) -> dict[str, int]:
        return {"job_stats": await self._records.drop_prefix(tenant, "job", f"{session_id}/")}


# -- traces ---------------------------------------------------------------------------


class RecordTraces:
    """`TraceDriver` on records: each trace's whole JSON, and its creation time apart (what
    pruning reads)."""

    def __init__(self, records: Records, driver: Driver) -> None:
        self._records, self._driver = records, driver

    async def _base(self, tenant: str, session_id: str) -> str | None:
        created = (await self._driver.version(tenant, session_id)).created_at
        return None if created is None else f"{session_id}/{_generation(created)}/"

    async def put_trace(
        self, tenant: str, session_id: str, trace: TurnTrace, *, keep: int = 0,
        older_than: datetime | None = None,
    ) -> None:
        base = await self._base(tenant, session_id)
        if base is None:
            return
        key = f"{base}{trace.turn:010d}"
        await self._records.put(tenant, "trace-age", key, str(to_micros(trace.created_at)).encode())
        await self._records.put(tenant, "trace", key, trace_to_json(trace).encode())
        if keep or older_than is not None:
            await self._prune(tenant, base, keep, older_than)

    async def _prune(self, tenant: str, base: str, keep: int, older_than: datetime | None) -> None:
        ages = await self._records.raw.list_records(tenant, "trace-age", base)
        newest = max((int(key[len(base):]) for key, _ in ages), default=0)
        cutoff = to_micros(older_than) if older_than is not None else None
        for key, age in ages:
            turn = int(key[len(base):])
            if (keep and turn <= newest - keep) or (cutoff is not None and int(age) < cutoff):
                await self._records.drop(tenant, "trace", key)
                await self._records.drop(tenant, "trace-age", key)

    async def get_trace(self, tenant: str, session_id: str, turn: int) -> TurnTrace | None:
        base = await self._base(tenant, session_id)
        if base is None:
            return None
        data = await self._records.raw.get_record(tenant, "trace", f"{base}{turn:010d}")
        return None if data is None else trace_from_json(data.decode())

    async def delete_traces(self, tenant: str, session_id: str) -> int:
        count = await self._records.drop_prefix(tenant, "trace", f"{session_id}/")
        await self._records.drop_prefix(tenant, "trace-age", f"{session_id}/")
        return count

    async def drop_session(self, tenant: str, session_id: str) -> dict[str, int]:
        return {"traces": await self.delete_traces(tenant, session_id)}


class DropsNativeTraces:
    """A driver's own traces erased (and counted) by the front's erasure."""

    def __init__(self, traces: TraceDriver) -> None:
        self._traces = traces

    async def drop_session(self, tenant: str, session_id: str) -> dict[str, int]:
        return {"traces": await self._traces.delete_traces(tenant, session_id)}


# -- idempotency records --------------------------------------------------------------


def _idempotency_json(record: IdempotencyRecord, session_id: str) -> bytes:
    return dumps({"fingerprint": record.fingerprint, "status": record.status,
                  "response": record.response, "session_id": session_id}).encode()


def _idempotency(data: bytes) -> tuple[IdempotencyRecord, str]:
    raw = _json(data)
    record = IdempotencyRecord(
        fingerprint=raw["fingerprint"], status=int(raw["status"]), response=raw["response"]
    )
    return record, str(raw["session_id"])


class RecordIdempotency:
    """`IdempotencyDriver` on records: the key's record expires with its lease, then with its
    TTL; an index record per (session, key) lets erasure find a session's keys."""

    def __init__(self, records: Records) -> None:
        self._records = records

    async def claim_idempotency(
        self, tenant: str, key: str, fingerprint: str, *, session_id: str, lease_s: float
    ) -> IdempotencyRecord | None:
        running = IdempotencyRecord(fingerprint=fingerprint, status=0, response="")
        value = _idempotency_json(running, session_id)
        raw = self._records.raw
        while True:
            if await raw.swap_record(tenant, "idempotency", key, None, value, ttl_s=lease_s):
                await self._records.put(tenant, "idempotency-of", f"{session_id}/{key}", b"", ttl_s=lease_s)
                return None
            held = await raw.get_record(tenant, "idempotency", key)
            if held is not None:
                return _idempotency(held)[0]

    async def finish_idempotency(
        self, tenant: str, key: str, *, status: int, response: str, ttl_s: float
    ) -> None:
        raw = self._records.raw
        while True:
            held = await raw.get_record(tenant, "idempotency", key)
            if held is None:
                return
            record, session_id = _idempotency(held)
            done = _idempotency_json(replace(record, status=status, response=response), session_id)
            if await raw.swap_record(tenant, "idempotency", key, held, done, ttl_s=ttl_s):
                await self._records.put(tenant, "idempotency-of", f"{session_id}/{key}", b"", ttl_s=ttl_s)
                return

    async def release_idempotency(self, tenant: str, key: str) -> None:
        await self._records.drop(tenant, "idempotency", key)

    async def drop_session(self, tenant: str, session_id: str) -> dict[str, int]:
        """Erase the session's live records (a key now held by another session stays)."""
        count = 0
        prefix = f"{session_id}/"
        for index_key, _ in await self._records.raw.list_records(tenant, "idempotency-of", prefix):
            key = index_key[len(prefix):]
            held = await self._records.raw.get_record(tenant, "idempotency", key)
            if held is not None and _idempotency(held)[1] == session_id:
                count += await self._records.raw.swap_record(tenant, "idempotency", key, held, None)
            await self._records.drop(tenant, "idempotency-of", index_key)
        return {"idempotency": count}


# -- erasure and the deletion log ---------------------------------------------------


def _deletion_json(record: DeletionRecord) -> bytes:
    finished = record.finished_at.isoformat() if record.finished_at else None
    return dumps({"id": record.id, "tenant": record.tenant, "scope": record.scope,
                  "target": record.target, "actor": record.actor,
                  "started_at": record.started_at.isoformat(), "finished_at": finished,
                  "counts": dict(record.counts)}).encode()


def _deletion(data: bytes) -> DeletionRecord:
    raw = _json(data)
    scope = raw["scope"]
    if scope not in get_args(Scope):
        raise ValueError(f"unknown deletion scope {scope!r}")
    finished = raw.get("finished_at")
    return DeletionRecord(
        id=int(raw["id"]), tenant=raw["tenant"], scope=cast(Scope, scope), target=raw["target"],
        actor=raw["actor"], started_at=datetime.fromisoformat(raw["started_at"]),
        finished_at=datetime.fromisoformat(finished) if finished else None,
        counts={k: int(v) for k, v in raw.get("counts", {}).items()},
    )


_ERASED_KINDS = ("sessions", "turns", "summaries", "pins", "emotion_scores", "job_stats",
                 "traces", "idempotency")


class RecordLifecycle:
    """`LifecycleDriver` on the core and records: a session erased by `Driver.delete` after
    the records the front keeps of it (``drops``), counted from what it held; the deletion log
    as records. It cannot erase a session's oldest turns nor restore a session's owner and
    times (the core has no write for either): those raise `ConfigError`."""

    def __init__(self, records: Records, driver: Driver, drops: Sequence[DropsSession]) -> None:
        self._records, self._driver, self._drops = records, driver, drops

    async def _held(self, tenant: str, session_id: str) -> dict[str, int]:
        """What erasing the session removes from its log and derived records, counted."""
        counts = dict.fromkeys(_ERASED_KINDS, 0)
        info = await self._driver.info(tenant, session_id)
        if info is None:
            return counts
        state = await self._driver.load(tenant, session_id, recent=0, max_uncovered=0)
        turns = await self._driver.turns(tenant, session_id)
        counts.update(
            turns=len(turns), summaries=int(state.summary is not None), pins=len(state.constraints),
            emotion_scores=sum(t.emotion is not None for t in turns), job_stats=len(info.jobs),
        )
        return counts

    async def erase_session(
        self, tenant: str, session_id: str, *, record_id: int | None = None
    ) -> dict[str, int]:
        counts = await self._held(tenant, session_id)
        for drops in self._drops:
            merge_counts(counts, await drops.drop_session(tenant, session_id))
        counts["sessions"] = int(await self._driver.delete(tenant, session_id))
        if record_id is not None:
            await self._change(record_id, lambda r: replace(r, counts=merge_counts(dict(r.counts), counts)))
        return counts

    async def erase_turns_before(
        self, tenant: str, session_id: str, seq: int, *, record_id: int | None = None
    ) -> dict[str, int]:
        raise ConfigError(
            "this store's backend cannot erase a session's oldest turns (its driver has no "
            "erase_turns_before): a retention turn limit needs a backend that can"
        )

    async def compact(self) -> None:
        return None

    async def restore_session(
        self, tenant: str, session_id: str, *, user_id: str | None,
        created_at: datetime, updated_at: datetime,
    ) -> bool:
        raise ConfigError(
            "this store's backend cannot set a session's owner and times (its driver has no "
            "restore_session): import into a backend that can"
        )

    async def _change(
        self, record_id: int, change: Callable[[DeletionRecord], DeletionRecord]
    ) -> DeletionRecord:
        def swap(old: bytes | None) -> bytes:
            if old is None:
                raise InputError(f"no deletion record {record_id}")
            return _deletion_json(change(_deletion(old)))

        written = await self._records.update(_STORE, "deletion", f"{record_id:012d}", swap)
        return _deletion(written or b"")

    async def _next_id(self) -> int:
        written = await self._records.update(
            _STORE, "deletion-next", "", lambda old: str(int(old or b"0") + 1).encode()
        )
        return int(written or b"0")

    async def open_deletion(
        self, tenant: str, scope: Scope, target: str, *, actor: str
    ) -> DeletionRecord:
        raw, slot = self._records.raw, f"{tenant}/{scope}/{target}"
        while True:
            open_id = await raw.get_record(_STORE, "deletion-open", slot)
            if open_id is not None:
                found = await raw.get_record(_STORE, "deletion", f"{int(open_id):012d}")
                if found is not None and _deletion(found).pending:
                    return _deletion(found)
                await raw.swap_record(_STORE, "deletion-open", slot, open_id, None)  # finished
                continue
            record = DeletionRecord(id=await self._next_id(), tenant=tenant, scope=scope,
                                    target=target, actor=actor, started_at=utc_now())
            await self._records.put(_STORE, "deletion", f"{record.id:012d}", _deletion_json(record))
            if await raw.swap_record(_STORE, "deletion-open", slot, None, str(record.id).encode()):
                return record
            await self._records.drop(_STORE, "deletion", f"{record.id:012d}")  # another opened it

    async def finish_deletion(self, record_id: int, extra: Mapping[str, int]) -> DeletionRecord:
        record = await self._change(record_id, lambda r: replace(
            r, counts=merge_counts(dict(r.counts), extra), finished_at=r.finished_at or utc_now()
        ))
        slot = f"{record.tenant}/{record.scope}/{record.target}"
        await self._records.raw.swap_record(_STORE, "deletion-open", slot, str(record_id).encode(), None)
        return record

    async def deletions(
        self, *, since_id: int = 0, pending_only: bool = False, limit: int = 100
    ) -> list[DeletionRecord]:
        listed = await self._records.raw.list_records(_STORE, "deletion")
        found = [_deletion(value) for _, value in listed]
        return [r for r in found if r.id > since_id and (r.pending or not pending_only)][:limit]


# -- reads built on the core -----------------------------------------------------------


async def turns_at_by_range(
    driver: Driver, tenant: str, session_id: str, seqs: Sequence[int]
) -> list[Turn]:
    """`TurnsAtDriver.turns_at` as one range read from the lowest seq to the highest."""
    wanted = set(seqs)
    if not wanted:
        return []
    turns = await driver.turns(tenant, session_id, from_seq=min(wanted), to_seq=max(wanted))
    return [t for t in turns if t.seq in wanted]


async def _all_sessions(driver: Driver, tenant: str) -> list[tuple[str, str | None, datetime]]:
    """Every session of ``tenant``: (session id, user id, updated_at)."""
    found: list[tuple[str, str | None, datetime]] = []
    while page := await driver.list_sessions(tenant, limit=_PAGE, offset=len(found)):
        found += [(i.session_id, i.user_id, i.updated_at) for i in page]
    return found


async def list_users_by_sessions(
    driver: Driver, tenant: str, *, limit: int = 100, offset: int = 0
) -> list[UserInfo]:
    """`UserDriver.list_users` from the tenant's sessions, grouped by user."""
    users: dict[str, tuple[int, datetime]] = {}
    for _, user_id, updated_at in await _all_sessions(driver, tenant):
        if user_id is not None:
            count, newest = users.get(user_id, (0, updated_at))
            users[user_id] = (count + 1, max(newest, updated_at))
    infos = [UserInfo(tenant=tenant, user_id=u, sessions=n, updated_at=at) for u, (n, at) in users.items()]
    infos.sort(key=lambda i: (i.updated_at, i.user_id), reverse=True)
    return infos[offset : offset + limit]


async def purge_by_listing(
    driver: Driver, older_than: datetime, delete: Callable[[str, str], Awaitable[bool]]
) -> int:
    """`PurgeDriver.purge_idle`: every tenant's sessions listed, the idle ones deleted with
    ``delete`` (the front's, which erases the records it keeps of them too)."""
    idle = [
        (tenant, session_id)
        for tenant in await driver.list_tenants()
        for session_id, _, updated_at in await _all_sessions(driver, tenant)
        if updated_at < older_than
    ]
    return sum([await delete(tenant, session_id) for tenant, session_id in idle])

