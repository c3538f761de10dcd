"""The driver seam's core: a driver with only the 15 core methods (`store.minimal`) is a whole
store through its front, which provides every other ability on the driver's keyed records."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from contextmode.errors import ConfigError, LockNotAcquired
from contextmode.store.drivers import Driver, KeyedRecords
from contextmode.store.front import StoreFront, records_for
from contextmode.store.lifecycle import is_lifecycle_store
from contextmode.store.memory import MemoryDriver
from contextmode.store.minimal import MinimalDriver
from contextmode.store.postgres.driver import PostgresDriver
from contextmode.store.records import TurnTrace
from contextmode.store.redis.driver import RedisDriver
from contextmode.store.sqlite.driver import SQLiteDriver
from contextmode.testing.contract import StoreContract, new_turns
from contextmode.testing.contract_lifecycle import LifecycleContract
from contextmode.types import SessionKey, Summary

_K = SessionKey("t", "s")


def _store() -> StoreFront[MinimalDriver]:
    return StoreFront(MinimalDriver())


class TestMinimalStore(StoreContract):
    @pytest.fixture
    async def store(self) -> AsyncIterator[StoreFront[MinimalDriver]]:
        async with _store() as store:
            yield store


class TestMinimalLifecycle(LifecycleContract):
    """The lifecycle contract, but for the two calls the core has no write for: they refuse."""

    @pytest.fixture
    async def store(self) -> StoreFront[MinimalDriver]:
        return _store()

    async def test_erase_turns_before_keeps_the_newest(self, store: StoreFront[MinimalDriver]) -> None:
        await store.append(_K, new_turns(10))
        with pytest.raises(ConfigError, match="oldest turns"):
            await store.erase_turns_before(_K, 7)
        assert len(await store.turns(_K)) == 10

    async def test_restore_session_sets_owner_and_times(self, store: StoreFront[MinimalDriver]) -> None:
        await store.append(_K, new_turns(1))
        at = datetime(2024, 1, 2, tzinfo=UTC)
        with pytest.raises(ConfigError, match="owner and times"):
            await store.restore_session(_K, user_id="u5", created_at=at, updated_at=at)


def test_the_core_is_fifteen_methods() -> None:
    members = [
        name for protocol in (Driver, KeyedRecords) for name, value in vars(protocol).items()
        if callable(value) and not name.startswith("_")
    ]
    assert len(members) == 15, members


def test_every_shipped_driver_has_every_ability_natively(tmp_path: Path) -> None:
    drivers = [MemoryDriver(), SQLiteDriver(tmp_path / "a.db"),
               PostgresDriver("postgresql://nowhere/none"), RedisDriver("redis://nowhere:1/0")]
    assert [records_for(driver) for driver in drivers] == [None] * 4  # no ability kept by the front


def test_a_driver_lacking_an_ability_and_records_is_refused() -> None:
    class LogOnly(MinimalDriver):
        get_record = swap_record = list_records = None

    with pytest.raises(TypeError, match=r"LockDriver.*no KeyedRecords"):
        StoreFront(LogOnly())


async def test_the_front_keeps_what_the_driver_lacks_apart_per_session_and_incarnation() -> None:
    store = _store()
    assert is_lifecycle_store(store)
    await store.append(_K, new_turns(4), user_id="u1")
    await store.record_job(_K, "summary", ok=False, error="bad json", rejected=True)
    await store.record_job(SessionKey("t", "other"), "summary", ok=True)  # unknown session: ignored
    info = await store.info(_K)
    assert info is not None and (info.jobs["summary"].rejected, info.jobs["summary"].last_error) == (1, "bad json")
    assert (await store.list_sessions("t"))[0].jobs == info.jobs
    assert [(u.user_id, u.sessions) for u in await store.list_users("t")] == [("u1", 1)]
    assert [t.seq for t in await store.turns_at(_K, [4, 1, 9])] == [1, 4]
    # A purge erases the records kept of each idle session, so a new session starts bare.
    assert await store.purge_idle(datetime.now(UTC) + timedelta(seconds=1)) == 1
    await store.append(_K, new_turns(1))
    info = await store.info(_K)
    assert info is not None and dict(info.jobs) == {}
    assert await store.driver.list_records("t", "job") == []


async def test_kept_locks_expire_and_fence_across_keys() -> None:
    store = _store()
    async with store.lock(_K, ttl_s=0.05) as first:
        with pytest.raises(LockNotAcquired):
            async with store.lock(_K):
                pass
        await asyncio.sleep(0.1)
        async with store.lock(_K) as taken_over:  # the first one expired
            assert taken_over.token > first.token
        async with store.turn_lock(_K) as turn:
            assert turn.token > taken_over.token
    assert await store.driver.list_records("", "lock") == []


async def test_erasure_counts_what_the_front_kept_and_logs_it() -> None:
    store = _store()
    await store.append(_K, new_turns(4))
    await store.commit_summary(_K, Summary(text="s", covers_seq=2, tokens=1), expected_version=0)
    assert await store.claim_idempotency("t", "k", "fp", session_id="s", lease_s=60) is None
    record = await store.open_deletion("t", "session", "s", actor="test")
    counts = await store.erase_session(_K, record_id=record.id)
    assert (counts["sessions"], counts["turns"], counts["summaries"], counts["idempotency"]) == (1, 4, 1, 1)
    done = await store.finish_deletion(record.id, {"files": 2})
    assert (done.counts["turns"], done.counts["files"], done.pending) == (4, 2, False)
    assert await store.deletions() == [done]
    assert await store.driver.list_records("t", "idempotency-of") == []


class _NativeTraces(MinimalDriver):
    """The core plus traces of its own (a `TraceDriver`): the front keeps the rest."""

    def __init__(self) -> None:
        super().__init__()
        self.traces: dict[tuple[str, str, int], TurnTrace] = {}

    async def put_trace(self, tenant: str, session_id: str, trace: TurnTrace, *, keep: int = 0,
                        older_than: datetime | None = None) -> None:
        if (await self.version(tenant, session_id)).created_at is not None:
            self.traces[(tenant, session_id, trace.turn)] = trace

    async def get_trace(self, tenant: str, session_id: str, turn: int) -> TurnTrace | None:
        return self.traces.get((tenant, session_id, turn))

    async def delete_traces(self, tenant: str, session_id: str) -> int:
        mine = [k for k in self.traces if k[:2] == (tenant, session_id)]
        for k in mine:
            del self.traces[k]
        return len(mine)


async def test_a_native_ability_is_used_and_the_front_erases_and_counts_it() -> None:
    driver = _NativeTraces()
    store = StoreFront(driver)
    await store.append(_K, new_turns(2))
    trace = TurnTrace(turn=1, user_seq=1, answer_seq=2, created_at=datetime.now(UTC), typed="hi", sent="hi")
    await store.put_trace(_K, trace)
    assert list(driver.traces) == [("t", "s", 1)] and await store.driver.list_records("t", "trace") == []
    assert await store.get_trace(_K, 1) == trace
    counts = await store.erase_session(_K)
    assert (counts["traces"], counts["turns"], driver.traces) == (1, 2, {})


def test_a_native_erasure_needs_native_session_records() -> None:
    class ErasesItself(MinimalDriver):
        erase_session = erase_turns_before = compact = open_deletion = finish_deletion = print
        deletions = restore_session = print

    with pytest.raises(TypeError, match="erases sessions itself"):
        StoreFront(ErasesItself())
