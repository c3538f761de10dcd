"""JobRunner: one job per session at a time, retries, recorded failures, stale results rejected."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import pytest

from contextmode.errors import ConfigError, OutputRejected
from contextmode.jobs import JobFactory, JobRunner, JobSettings, StepFailed, report_step
from contextmode.store import MemoryStore
from contextmode.store.base import JobOutcome, LockHandle
from contextmode.store.sqlite import SQLiteStore
from contextmode.testing.contract import new_turns
from contextmode.types import SessionKey, Summary

FAST = JobSettings(base_delay_s=0.0, jitter=0.0, timeout_s=5.0, lock_ttl_s=10.0)


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    store = SQLiteStore(tmp_path / "jobs.db")
    yield store
    await store.close()


async def test_summariser_failing_three_times_leaves_the_log_untouched(
    sqlite_store: SQLiteStore,
) -> None:
    store = sqlite_store
    await store.append(SessionKey("t", "s"), new_turns(12))
    before = await store.turns(SessionKey("t", "s"))
    calls = 0

    async def summarise() -> None:
        nonlocal calls
        calls += 1
        await store.load(SessionKey("t", "s"))
        raise RuntimeError("model timed out")

    runner = JobRunner(store, FAST)
    runner.schedule("t", "s", "summary", summarise)
    assert runner.pending("t", "s") == ["summary"]
    await runner.drain()
    assert calls == 3
    assert await store.turns(SessionKey("t", "s")) == before
    info = await store.info(SessionKey("t", "s"))
    assert info is not None
    stats = info.jobs["summary"]
    assert (stats.ok, stats.failed) == (0, 1)
    assert stats.last_error is not None and "model timed out" in stats.last_error
    assert info.summary_version == 0 and info.last_seq == 12
    assert runner.pending("t", "s") == []


async def test_a_job_made_of_steps_counts_each_step_under_its_name() -> None:
    store = MemoryStore()
    await store.append(SessionKey("t", "s"), new_turns(1))
    attempts = 0

    async def unit() -> None:
        nonlocal attempts
        attempts += 1
        failures: list[tuple[str, BaseException]] = []
        if attempts == 1:
            report_step("emotion", ok=True)
        report_step("summary", ok=False, error="echoes the prompt", rejected=True)
        failures.append(("constraints", RuntimeError("extractor down")))
        raise StepFailed(failures)

    runner = JobRunner(store, JobSettings(attempts=2, base_delay_s=0.0, jitter=0.0))
    runner.schedule("t", "s", "memory", unit)
    assert runner.units("t", "s") == 1 and runner.units("t", "other") == 0
    await runner.drain()
    info = await store.info(SessionKey("t", "s"))
    assert info is not None
    stats = {name: (j.ok, j.failed, j.rejected) for name, j in info.jobs.items()}
    # the unit itself is not counted; each step is, the failed one once, after the last attempt
    assert stats == {"emotion": (1, 0, 0), "summary": (0, 0, 2), "constraints": (0, 1, 0)}
    error = info.jobs["constraints"].last_error
    assert error == "after 2 attempts: RuntimeError: extractor down"
    assert runner.units("t", "s") == 0


async def test_retry_then_success_is_recorded_once() -> None:
    store = MemoryStore()
    await store.append(SessionKey("t", "s"), new_turns(2))
    outcomes = iter([RuntimeError("429"), None])

    async def flaky() -> None:
        error = next(outcomes)
        if error:
            raise error

    delays: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        delays.append(seconds)

    settings = JobSettings(base_delay_s=0.5, jitter=0.0, timeout_s=5.0, lock_ttl_s=10.0)
    runner = JobRunner(store, settings, sleep=fake_sleep)
    runner.schedule("t", "s", "constraints", flaky)
    await runner.drain()
    info = await store.info(SessionKey("t", "s"))
    assert info is not None
    assert (info.jobs["constraints"].ok, info.jobs["constraints"].failed) == (1, 0)
    assert delays == [0.5]


async def test_backoff_doubles_and_is_capped() -> None:
    delays: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        delays.append(seconds)

    async def always_fails() -> None:
        raise ValueError("bad JSON")

    settings = JobSettings(attempts=5, base_delay_s=1.0, max_delay_s=4.0, jitter=0.0,
                           timeout_s=5.0, lock_ttl_s=10.0)
    runner = JobRunner(None, settings, sleep=fake_sleep)
    runner.schedule("t", "s", "summary", always_fails)
    await runner.drain()
    assert delays == [1.0, 2.0, 4.0, 4.0]


async def test_one_job_per_session_at_a_time_sessions_in_parallel() -> None:
    store = MemoryStore()
    running: dict[str, int] = {"a": 0, "b": 0}
    peak: dict[str, int] = {"a": 0, "b": 0}
    overlap_seen = asyncio.Event()
    order: list[str] = []

    def job(session: str, name: str) -> JobFactory:
        async def body() -> None:
            running[session] += 1
            peak[session] = max(peak[session], running[session])
            if running["a"] and running["b"]:
                overlap_seen.set()
            await asyncio.sleep(0.01)
            order.append(f"{session}:{name}")
            running[session] -= 1

        return body

    runner = JobRunner(store, FAST)
    for name in ("emotion", "constraints", "summary"):
        runner.schedule("t", "a", name, job("a", name))
        runner.schedule("t", "b", name, job("b", name))
    assert runner.pending("t", "a") == ["emotion", "constraints", "summary"]
    await runner.drain()
    assert peak == {"a": 1, "b": 1}
    assert overlap_seen.is_set()
    assert [o for o in order if o.startswith("a:")] == ["a:emotion", "a:constraints", "a:summary"]


async def test_coalesce_replaces_a_waiting_job_of_the_same_name() -> None:
    ran: list[str] = []
    gate = asyncio.Event()

    async def blocker() -> None:
        await gate.wait()

    def summary(tag: str) -> JobFactory:
        async def body() -> None:
            ran.append(tag)

        return body

    runner = JobRunner(None, FAST)
    runner.schedule("t", "s", "emotion", blocker)
    await asyncio.sleep(0)
    runner.schedule("t", "s", "summary", summary("old"), coalesce=True)
    runner.schedule("t", "s", "summary", summary("new"), coalesce=True)
    assert runner.pending("t", "s") == ["emotion", "summary"]
    gate.set()
    await runner.drain()
    assert ran == ["new"]


async def test_a_coalesced_job_scheduled_during_its_retry_is_that_retry() -> None:
    """The session's unit fails once and waits to try again: a turn arriving meanwhile merges
    into the retry (it calls the factory anew, reading the latest state) instead of queueing a
    second unit behind it."""
    backing_off, resume = asyncio.Event(), asyncio.Event()
    runs: list[str] = []

    async def sleep(_: float) -> None:
        backing_off.set()
        await resume.wait()

    def unit(tag: str) -> JobFactory:
        async def body() -> None:
            runs.append(tag)
            if len(runs) == 1:
                raise RuntimeError("the model timed out")

        return body

    runner = JobRunner(None, FAST, sleep=sleep)
    runner.schedule("t", "s", "memory", unit("first"), coalesce=True)
    await backing_off.wait()
    assert runner.units("t", "s") == 1
    runner.schedule("t", "s", "memory", unit("second"), coalesce=True)
    assert runner.units("t", "s") == 1 and runner.pending("t", "s") == ["memory"]
    resume.set()
    await runner.drain()
    assert runs == ["first", "first"]  # the retry covered the second turn: two runs, not three

    # Not retrying: a coalesced job scheduled while one of its name runs waits behind it.
    gate = asyncio.Event()

    async def running() -> None:
        await gate.wait()

    runner.schedule("t", "s", "memory", running, coalesce=True)
    await asyncio.sleep(0)
    runner.schedule("t", "s", "memory", unit("third"), coalesce=True)
    assert runner.units("t", "s") == 2
    gate.set()
    await runner.drain()
    assert runs[-1] == "third"


async def test_stale_summary_arriving_after_a_newer_one_is_rejected(
    sqlite_store: SQLiteStore,
) -> None:
    """Two workers (two runners on one file): the first stalls past its lock's expiry."""
    store = sqlite_store
    await store.append(SessionKey("t", "s"), new_turns(6))
    newer_committed = asyncio.Event()
    slow_started = asyncio.Event()
    results: dict[str, bool] = {}

    async def slow_summary() -> None:
        state = await store.load(SessionKey("t", "s"))
        slow_started.set()
        await newer_committed.wait()  # meanwhile the lock expires and another worker runs
        summary = Summary(text="from seq 4", covers_seq=4, tokens=1)
        version = state.summary.version if state.summary else 0
        results["slow"] = await store.commit_summary(SessionKey("t", "s"), summary, expected_version=version)

    async def fast_summary() -> None:
        await store.append(SessionKey("t", "s"), new_turns(4, start=7))
        state = await store.load(SessionKey("t", "s"))
        summary = Summary(text="from seq 10", covers_seq=10, tokens=1)
        version = state.summary.version if state.summary else 0
        results["fast"] = await store.commit_summary(SessionKey("t", "s"), summary, expected_version=version)
        newer_committed.set()

    short_lock = JobSettings(base_delay_s=0.05, jitter=0.0, timeout_s=None, lock_ttl_s=0.2)
    worker_a, worker_b = JobRunner(store, short_lock), JobRunner(store, short_lock)
    worker_a.schedule("t", "s", "summary", slow_summary)
    await slow_started.wait()
    worker_b.schedule("t", "s", "summary", fast_summary)
    await asyncio.gather(worker_a.drain(), worker_b.drain())
    assert results == {"fast": True, "slow": False}
    state = await store.load(SessionKey("t", "s"))
    assert state.summary is not None
    assert (state.summary.text, state.summary.covers_seq, state.summary.version) == (
        "from seq 10", 10, 1)
    assert [t.seq for t in await store.turns(SessionKey("t", "s"))] == list(range(1, 11))


async def test_the_store_lock_keeps_two_runners_off_one_session(
    sqlite_store: SQLiteStore,
) -> None:
    store = sqlite_store
    await store.append(SessionKey("t", "s"), new_turns(1))
    active = 0
    peak = 0

    async def job() -> None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.02)
        active -= 1

    settings = JobSettings(base_delay_s=0.01, jitter=0.5, timeout_s=5.0, lock_ttl_s=10.0,
                           lock_attempts=200)
    runners = [JobRunner(store, settings) for _ in range(3)]
    for runner in runners:
        for _ in range(3):
            runner.schedule("t", "s", "emotion", job)
    await asyncio.gather(*(r.drain() for r in runners))
    assert peak == 1
    info = await store.info(SessionKey("t", "s"))
    assert info is not None and info.jobs["emotion"].ok == 9


async def test_a_held_lock_makes_the_job_skip_after_its_tries() -> None:
    store = MemoryStore()
    ran = False

    async def job() -> None:
        nonlocal ran
        ran = True

    settings = JobSettings(base_delay_s=0.0, jitter=0.0, timeout_s=5.0, lock_ttl_s=10.0,
                           lock_attempts=3)
    runner = JobRunner(store, settings)
    async with store.lock(SessionKey("t", "s")):
        runner.schedule("t", "s", "summary", job)
        await runner.drain()
    assert not ran


async def test_timeouts_count_as_failures() -> None:
    async def hangs() -> None:
        await asyncio.Event().wait()

    store = MemoryStore()
    await store.append(SessionKey("t", "s"), new_turns(1))
    settings = JobSettings(attempts=2, base_delay_s=0.0, jitter=0.0, timeout_s=0.01, lock_ttl_s=1)
    runner = JobRunner(store, settings)
    runner.schedule("t", "s", "emotion", hangs)
    await runner.drain()
    info = await store.info(SessionKey("t", "s"))
    assert info is not None and info.jobs["emotion"].failed == 1
    assert "TimeoutError" in (info.jobs["emotion"].last_error or "")


async def test_a_cut_attempt_says_which_limit_cut_it_and_a_jobs_own_timeout_is_left_alone() -> None:
    async def hangs() -> None:
        await asyncio.Event().wait()

    async def times_out_itself() -> None:
        raise TimeoutError("the model took too long")

    store = MemoryStore()
    await store.append(SessionKey("t", "s"), new_turns(1))
    runner = JobRunner(store, JobSettings(attempts=1, base_delay_s=0.0, jitter=0.0, timeout_s=0.05, lock_ttl_s=1))
    runner.schedule("t", "s", "emotion", hangs)
    runner.schedule("t", "s", "constraints", times_out_itself)
    await runner.drain()
    info = await store.info(SessionKey("t", "s"))
    assert info is not None
    assert "longer than 0.05 s (CONTEXTMODE_JOB_TIMEOUT_S)" in (info.jobs["emotion"].last_error or "")
    assert "the model took too long" in (info.jobs["constraints"].last_error or "")


async def test_aclose_cancels_pending_work() -> None:
    started = asyncio.Event()

    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    runner = JobRunner(None, JobSettings(timeout_s=None))
    runner.schedule("t", "s", "summary", forever)
    runner.schedule("t", "s", "emotion", forever)
    await started.wait()
    await runner.aclose()
    assert runner.pending("t", "s") == []
    await runner.drain()


def test_settings_validation_and_env() -> None:
    with pytest.raises(ConfigError):
        JobSettings(attempts=0)
    with pytest.raises(ConfigError):
        JobSettings(timeout_s=60, lock_ttl_s=30)
    settings = JobSettings.from_env({"CONTEXTMODE_JOB_ATTEMPTS": "5",
                                     "CONTEXTMODE_JOB_BASE_DELAY_S": "0.1"})
    assert (settings.attempts, settings.base_delay_s) == (5, 0.1)
    with pytest.raises(ConfigError):
        JobSettings.from_env({"CONTEXTMODE_JOB_ATTEMPTS": "three"})


class _CountingLocks(MemoryStore):
    """A MemoryStore that counts the session locks taken and notes whether one is held."""

    def __init__(self) -> None:
        super().__init__()
        self.taken = 0
        self.held = False

    def lock(self, key: SessionKey, *, ttl_s: float = 60.0) -> AbstractAsyncContextManager[LockHandle]:
        inner = super().lock(key, ttl_s=ttl_s)

        @asynccontextmanager
        async def counted() -> AsyncIterator[LockHandle]:
            async with inner as handle:
                self.taken += 1
                self.held = True
                try:
                    yield handle
                finally:
                    self.held = False

        return counted()


@pytest.mark.parametrize(
    ("settings", "locks"),
    [
        (FAST, 1),  # 3 attempts of ≤ 5 s fit in a 10 s lock taken once
        (JobSettings(base_delay_s=0.0, jitter=0.0, timeout_s=None, lock_ttl_s=10.0), 3),  # no bound: per job
    ],
)
async def test_a_burst_of_jobs_keeps_the_session_lock_only_while_an_attempt_fits(
    settings: JobSettings, locks: int
) -> None:
    store = _CountingLocks()
    await store.append(SessionKey("t", "s"), new_turns(1))
    under_lock: list[bool] = []

    async def job() -> None:
        under_lock.append(store.held)

    runner = JobRunner(store, settings)
    for name in ("emotion", "constraints", "summary"):
        runner.schedule("t", "s", name, job)
    await runner.drain()
    assert under_lock == [True, True, True]
    assert store.taken == locks
    assert not store.held  # released once the queue is empty
    info = await store.info(SessionKey("t", "s"))
    assert info is not None and {n: s.ok for n, s in info.jobs.items()} == {"emotion": 1, "constraints": 1, "summary": 1}


async def test_a_failed_attempt_releases_the_kept_lock_before_its_backoff() -> None:
    store = _CountingLocks()
    await store.append(SessionKey("t", "s"), new_turns(1))
    seen: list[bool] = []

    async def flaky() -> None:
        if not seen:
            seen.append(True)
            raise RuntimeError("once")

    async def sleep(_: float) -> None:
        seen.append(store.held)  # the retry's backoff: the lock must be free for other workers

    runner = JobRunner(store, FAST, sleep=sleep)
    runner.schedule("t", "s", "constraints", flaky)
    runner.schedule("t", "s", "emotion", flaky)
    await runner.drain()
    assert seen == [True, False]
    assert store.taken == 2  # the first attempt's lock, then one for the retry and the next job


class _BatchingStore(MemoryStore):
    """A store that counts several job outcomes in one write (`JobOutcomes`), and says how."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[list[tuple[str, bool]]] = []
        self.releases: list[LockHandle | None] = []

    async def record_jobs(
        self, key: SessionKey, outcomes: Sequence[JobOutcome], *, release: LockHandle | None = None
    ) -> None:
        self.writes.append([(o.job, o.ok) for o in outcomes])
        self.releases.append(release)
        for o in outcomes:
            await self.record_job(key, o.job, ok=o.ok, error=o.error, rejected=o.rejected)


async def test_a_burst_of_jobs_is_counted_in_one_write_when_it_ends() -> None:
    store = _BatchingStore()
    await store.append(SessionKey("t", "s"), new_turns(2))
    runner = JobRunner(store, FAST)
    done: list[str] = []

    def job(name: str, *, fail: bool = False) -> JobFactory:
        async def run() -> None:
            done.append(name)
            assert store.writes == []  # nothing counted while the burst runs
            if fail:
                raise OutputRejected("empty quote")

        return run

    runner.schedule("t", "s", "emotion", job("emotion"))
    runner.schedule("t", "s", "constraints", job("constraints", fail=True))
    runner.schedule("t", "s", "summary", job("summary"))
    await runner.drain()
    assert done == ["emotion", "constraints", "summary"]
    assert store.writes == [[("emotion", True), ("constraints", False), ("summary", True)]]
    assert [r is not None for r in store.releases] == [True]  # the session lock goes with them
    info = await store.info(SessionKey("t", "s"))
    assert info is not None
    assert (info.jobs["emotion"].ok, info.jobs["summary"].ok) == (1, 1)
    assert (info.jobs["constraints"].rejected, info.jobs["constraints"].last_error) == (1, "empty quote")


class _SlowCountingStore(_BatchingStore):
    """Counting a burst waits until the test lets it go."""

    def __init__(self) -> None:
        super().__init__()
        self.counting = asyncio.Event()
        self.go = asyncio.Event()

    async def record_jobs(
        self, key: SessionKey, outcomes: Sequence[JobOutcome], *, release: LockHandle | None = None
    ) -> None:
        self.counting.set()
        await self.go.wait()
        await super().record_jobs(key, outcomes, release=release)


async def test_a_finished_job_stays_pending_until_its_outcome_is_counted() -> None:
    """A reader (the web page's poll) must see a job either pending or counted, never neither."""
    store = _SlowCountingStore()
    await store.append(SessionKey("t", "s"), new_turns(2))
    runner = JobRunner(store, FAST)
    second = asyncio.Event()

    async def quick() -> None:
        pass

    async def wait_for_test() -> None:
        await second.wait()
        raise OutputRejected("empty quote")

    runner.schedule("t", "s", "emotion", quick)
    runner.schedule("t", "s", "constraints", wait_for_test)
    try:
        while runner.pending("t", "s")[:1] != ["constraints"]:
            await asyncio.sleep(0)
        assert runner.pending("t", "s") == ["constraints", "emotion"]  # emotion ran, not counted yet
        second.set()
        await store.counting.wait()
        info = await store.info(SessionKey("t", "s"))
        assert info is not None and info.jobs == {}  # nothing in the store yet...
        assert runner.pending("t", "s") == ["emotion", "constraints"]  # ...so both are still pending
        store.go.set()
        await runner.drain()
        assert runner.pending("t", "s") == []
        info = await store.info(SessionKey("t", "s"))
        assert info is not None and (info.jobs["emotion"].ok, info.jobs["constraints"].rejected) == (1, 1)
    finally:  # a failed check must not leave the burst waiting
        second.set()
        store.go.set()
        await runner.drain()


async def test_a_cancelled_burst_counts_nothing_more() -> None:
    store = _BatchingStore()
    await store.append(SessionKey("t", "s"), new_turns(2))
    runner = JobRunner(store, FAST)
    started = asyncio.Event()

    async def quick() -> None:
        pass

    async def slow() -> None:
        started.set()
        await asyncio.sleep(10)

    runner.schedule("t", "s", "emotion", quick)
    runner.schedule("t", "s", "summary", slow)
    await started.wait()
    assert runner.cancel("t", "s") == 1  # the session is being erased
    await asyncio.sleep(0)
    await runner.drain()
    assert store.writes == []
