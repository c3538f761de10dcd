"""Background jobs off the response path: one job per session at a time, retried, recorded.

`JobRunner.schedule()` returns at once; jobs of one session run one after the
other in this process (a per-session FIFO), and across processes each run
holds the store's session lock (`Store.lock`), so two workers never work on
the same session at once. A failing job is retried with exponential backoff;
its final outcome is logged and counted with `Store.record_job` (shown in
`SessionInfo.jobs`). Nothing here ever raises into the reply that scheduled it.

Jobs must commit through the store's compare-and-set methods
(`commit_summary`, `commit_constraints`): if a lock expired under a slow job
and a newer result landed, the slow result is rejected, never written over it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Protocol, TypeGuard, runtime_checkable

from ._protocols import implements
from .errors import ConfigError, LockNotAcquired, ModelDeferred, ModelPreempted, OutputRejected
from .models.priority import waits_excluded
from .store.base import (
    JobOutcome,
    LockHandle,
    Store,
    StoreAbility,
    counts_job_batches,
    let_go,
    one_connection,
)
from .types import SessionKey, utc_now

__all__ = [
    "HookedJobQueue",
    "JobFactory",
    "JobHooks",
    "JobQueue",
    "JobRunner",
    "JobSettings",
    "StepFailed",
    "report_step",
    "takes_hooks",
]

log = logging.getLogger("contextmode.jobs")

JobFactory = Callable[[], Awaitable[object]]
"""Makes the coroutine of one attempt; called again for every retry."""


@dataclass(frozen=True, kw_only=True)
class _Step:
    name: str
    ok: bool
    error: str | None = None
    rejected: bool = False


_STEPS: ContextVar[list[_Step] | None] = ContextVar("contextmode_job_steps", default=None)


def report_step(name: str, *, ok: bool, error: str | None = None, rejected: bool = False) -> None:
    """Inside a job made of steps (a session's unit of background work: emotion, constraints,
    summary), count one step's outcome under the step's own name; the job's own outcome is then
    not counted. Outside a job it does nothing."""
    steps = _STEPS.get()
    if steps is not None:
        steps.append(_Step(name=name, ok=ok, error=error, rejected=rejected))


class StepFailed(Exception):
    """Steps of a job made of steps failed (``failures``: each step's name and error, the first
    chained): the attempt failed, and if it was the last one each failure is counted under its
    step's name."""

    def __init__(self, failures: Sequence[tuple[str, BaseException]]) -> None:
        self.failures = [(step, _describe(error)) for step, error in failures]
        super().__init__("; ".join(f"{step}: {error}" for step, error in self.failures))
        if failures:
            self.__cause__ = failures[0][1]


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:500]


def _failures(exc: Exception, name: str) -> list[tuple[str, str]]:
    """``(job or step, error)`` for each failure a failed attempt stands for."""
    return exc.failures if isinstance(exc, StepFailed) else [(name, _describe(exc))]


class JobHooks(Protocol):
    """Told about every scheduled job and every failed attempt (the service's metrics)."""

    def job_scheduled(self, job: str) -> None: ...

    def job_failed(self, job: str) -> None: ...


class JobQueue(Protocol):
    """The engine's background job runner (`JobRunner`, or a test's own)."""

    def schedule(
        self, tenant: str, session_id: str, job_name: str, coro_factory: JobFactory, *, coalesce: bool = False
    ) -> None: ...

    def pending(self, tenant: str, session_id: str) -> list[str]: ...

    def sessions(self) -> list[tuple[str, str]]: ...

    def cancel(self, tenant: str, session_id: str) -> int: ...

    async def drain(self) -> None: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class HookedJobQueue(Protocol):
    """A job queue that reports to `JobHooks` (`JobRunner` does)."""

    hooks: JobHooks | None


def takes_hooks(jobs: object) -> TypeGuard[HookedJobQueue]:
    """True when ``jobs`` reports scheduled jobs and failed attempts to its ``hooks``."""
    return implements(jobs, HookedJobQueue)


@dataclass(frozen=True, kw_only=True)
class JobSettings:
    """Retry, timeout and lock settings of background jobs."""

    attempts: int = 3
    """Attempts per job before it is given up and recorded as failed (``CONTEXTMODE_JOB_ATTEMPTS``)."""
    base_delay_s: float = 0.5
    """Backoff before the 2nd attempt, doubled for each next one, seconds (``CONTEXTMODE_JOB_BASE_DELAY_S``)."""
    max_delay_s: float = 30.0
    """Cap of one backoff, seconds."""
    jitter: float = 0.1
    """Each backoff is scaled by a random factor in ``[1 - jitter, 1 + jitter]`` (spreads workers)."""
    timeout_s: float | None = 120.0
    """Time limit of one attempt, seconds; ``None`` = none (``CONTEXTMODE_JOB_TIMEOUT_S``).
    Room for one model call of an LLM processor on a one-slot server: up to
    ``CONTEXTMODE_LLM_BACKGROUND_WAIT_S`` (30 s) for the slot, then the call's own 60 s limit."""
    lock_ttl_s: float = 150.0
    """Expiry of the session lock an attempt holds, seconds; longer than ``timeout_s``."""
    lock_attempts: int = 20
    """Tries to get a session lock held by another worker (with backoff) before skipping the job."""

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.lock_attempts < 1:
            raise ConfigError("job attempts and lock attempts must be at least 1")
        if self.base_delay_s < 0 or self.max_delay_s < 0 or not 0 <= self.jitter < 1:
            raise ConfigError("job delays must be ≥ 0 and jitter in [0, 1)")
        if self.timeout_s is not None and self.lock_ttl_s <= self.timeout_s:
            raise ConfigError("lock_ttl_s must exceed timeout_s, or a live job could lose its lock")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> JobSettings:
        env = os.environ if env is None else env
        try:
            timeout = env.get("CONTEXTMODE_JOB_TIMEOUT_S")
            return cls(
                attempts=int(env.get("CONTEXTMODE_JOB_ATTEMPTS") or 3),
                base_delay_s=float(env.get("CONTEXTMODE_JOB_BASE_DELAY_S") or 0.5),
                timeout_s=float(timeout) if timeout else 120.0,
                lock_ttl_s=float(env.get("CONTEXTMODE_JOB_LOCK_TTL_S") or 150.0),
            )
        except ValueError as exc:
            raise ConfigError(f"invalid job setting: {exc}") from exc


@dataclass
class _SessionQueue:
    waiting: deque[tuple[str, JobFactory]] = field(default_factory=deque)
    running: str | None = None
    task: asyncio.Task[None] | None = None
    lock: AbstractAsyncContextManager[LockHandle] | None = None
    """The store's session lock, kept from one job to the next while more are waiting."""
    handle: LockHandle | None = None
    """``lock``'s handle (a store with `JobOutcomes` releases it with the burst's outcomes)."""
    lock_fits_until: float = 0.0
    """Monotonic time up to which another attempt (``timeout_s``) still ends inside the lock's ttl."""
    outcomes: list[JobOutcome] = field(default_factory=list)
    """Outcomes not yet counted in the store (one write per burst, on a store with `JobOutcomes`)."""
    counting: tuple[JobOutcome, ...] = ()
    """Outcomes being written by `_count` right now (still pending for `pending`)."""
    retrying: bool = False
    """The running job waits before another attempt, which calls its factory again: a coalesced
    job of its name scheduled meanwhile is that attempt (`JobRunner.schedule`)."""
    settled: bool = False
    """The running job's work has ended; only its outcome is being written (not a unit of work)."""


_MAX_PREEMPTED = 20
"""Times one job is cut short for replies (`ModelPreempted`) before it is left for the next turn
(a `ModelDeferred` wait given up is not counted: the job waits for as long as replies hold the slot)."""

_MAX_UNCOUNTED = 8
"""Outcomes a busy session's burst keeps before counting them (at the latest when it ends)."""


class _LockBusy(Exception):
    """The session lock stayed with another worker for every try."""


class JobRunner:
    """Runs per-session background jobs; ``store`` provides the cross-process lock and stats.

    ``sleep`` is injectable so tests need not wait for real backoffs. ``hooks`` (settable
    later: the service sets its metrics) hears of every scheduled job and failed attempt.
    """

    def __init__(
        self,
        store: Store | None = None,
        settings: JobSettings | None = None,
        *,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        hooks: JobHooks | None = None,
    ) -> None:
        self.store = store
        self.settings = settings or JobSettings()
        self.hooks = hooks
        self._sleep = sleep
        self._queues: dict[tuple[str, str], _SessionQueue] = {}
        self._batches = StoreAbility(counts_job_batches, store)

    def schedule(
        self,
        tenant: str,
        session_id: str,
        job_name: str,
        coro_factory: JobFactory,
        *,
        coalesce: bool = False,
    ) -> None:
        """Queue ``job_name`` for the session and return at once (needs a running event loop).

        With ``coalesce`` a job of the same name still waiting is replaced by this
        one instead of queueing a second: for jobs that read the latest state
        (summaries), not for jobs bound to one turn (emotion of turn N).
        """
        key = (tenant, session_id)
        if self.hooks is not None:
            self.hooks.job_scheduled(job_name)
        queue = self._queues.setdefault(key, _SessionQueue())
        if coalesce and queue.running == job_name and queue.retrying:
            return  # its next attempt reads the latest state: it covers this one
        if coalesce:
            for i, (name, _) in enumerate(queue.waiting):
                if name == job_name:
                    queue.waiting[i] = (job_name, coro_factory)
                    break
            else:
                queue.waiting.append((job_name, coro_factory))
        else:
            queue.waiting.append((job_name, coro_factory))
        if queue.task is None:
            queue.task = asyncio.get_running_loop().create_task(
                self._work(key, queue), name=f"contextmode-jobs:{tenant}/{session_id}"
            )

    def pending(self, tenant: str, session_id: str) -> list[str]:
        """Names of the session's running job (first), finished jobs whose outcome is not counted
        in the store yet, and waiting jobs, in order."""
        queue = self._queues.get((tenant, session_id))
        if queue is None:
            return []
        running = [queue.running] if queue.running else []
        # A finished job whose outcome is not in the store yet (counted with its burst) is still
        # pending: a reader that sees neither it nor its outcome would think nothing happened.
        uncounted = [o.job for o in (*queue.counting, *queue.outcomes) if o.job != queue.running]
        return running + list(dict.fromkeys(uncounted)) + [name for name, _ in queue.waiting]

    def units(self, tenant: str, session_id: str) -> int:
        """Jobs of the session running or waiting: work not done yet (`pending` also lists
        finished jobs whose outcome is being counted; a running job whose work has ended and
        whose outcome is being written is not a unit)."""
        queue = self._queues.get((tenant, session_id))
        if queue is None:
            return 0
        return (queue.running is not None and not queue.settled) + len(queue.waiting)

    def sessions(self) -> list[tuple[str, str]]:
        """``(tenant, session_id)`` of every session with a running or waiting job."""
        return list(self._queues)

    def cancel(self, tenant: str, session_id: str) -> int:
        """Drop the session's waiting jobs and cancel its running one (its data is being
        erased: a job must not hold the user's words or write them back). Returns how many."""
        queue = self._queues.pop((tenant, session_id), None)
        if queue is None:
            return 0
        dropped = len(queue.waiting) + (queue.running is not None)
        queue.waiting.clear()
        if queue.task is not None:
            queue.task.cancel()
        return dropped

    async def drain(self) -> None:
        """Wait until every scheduled job (and any it schedules) has finished."""
        while self._queues:
            tasks = [q.task for q in self._queues.values() if q.task is not None]
            await asyncio.gather(*tasks, return_exceptions=True)

    async def aclose(self) -> None:
        """Cancel waiting and running jobs (shutdown without draining)."""
        tasks = [q.task for q in self._queues.values() if q.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._queues.clear()

    # -- internals ----------------------------------------------------------------

    async def _work(self, key: tuple[str, str], queue: _SessionQueue) -> None:
        # The burst's store calls (lock, jobs, outcomes and release) share one pooled connection,
        # let go before each back-off and before a processor that may call a model (the jobs'
        # `Engine.let_go_before`); the attempts run in this task (`asyncio.timeout`) to share it.
        async with one_connection(self.store):
            await self._burst(key, queue)

    async def _burst(self, key: tuple[str, str], queue: _SessionQueue) -> None:
        try:
            while queue.waiting:
                name, factory = queue.waiting.popleft()
                queue.running, queue.settled = name, False
                try:
                    await self._run(key, name, factory, queue)
                except Exception:  # a bug here must not stop the session's other jobs
                    log.exception("job runner failed on %s for %s/%s", name, *key)
                finally:
                    queue.running = None
                if not queue.waiting or len(queue.outcomes) >= _MAX_UNCOUNTED:
                    await self._count(key, queue)
        finally:
            try:
                await self._unlock(queue)
            finally:
                try:
                    if self._queues.get(key) is queue:  # else cancelled: the session is being erased
                        await self._count(key, queue)
                finally:
                    if self._queues.get(key) is queue:
                        del self._queues[key]

    def _delay(self, attempt: int) -> float:
        s = self.settings
        growth: float = 2 ** (attempt - 1)
        delay = min(s.max_delay_s, s.base_delay_s * growth)
        return delay * random.uniform(1 - s.jitter, 1 + s.jitter)

    async def _run(self, key: tuple[str, str], name: str, factory: JobFactory, queue: _SessionQueue) -> None:
        steps: list[_Step] = []
        token = _STEPS.set(steps)
        try:
            counted = await self._run_steps(key, name, factory, queue, steps)
        finally:
            _STEPS.reset(token)
        if counted is not None and not counted:
            await self._record(key, queue, name, ok=True)

    async def _run_steps(
        self, key: tuple[str, str], name: str, factory: JobFactory, queue: _SessionQueue, steps: list[_Step]
    ) -> bool | None:
        """The job's attempts; each step it reports (`report_step`) is counted after its
        attempt. Returns whether any step was (the job's own success is counted otherwise), or
        ``None`` when the job's end was counted already."""
        attempts = self.settings.attempts
        attempt, cut, counted = 1, 0, False
        while attempt <= attempts:
            try:
                await self._attempt(key, name, factory, queue)
            except ModelPreempted as exc:
                counted = await self._count_steps(key, queue, steps) or counted
                # A reply took the model's slot, or held it so long the call gave up waiting
                # (`ModelDeferred`): not a failure. The attempt is made again once the gate lets
                # background calls in (it waits there), up to `_MAX_PREEMPTED` times.
                cut += not isinstance(exc, ModelDeferred)  # a wait given up is tried again, uncounted
                if cut <= _MAX_PREEMPTED:
                    log.info("job %s for %s/%s deferred for replies (%s); trying again", name, *key,
                             type(exc).__name__)
                    await let_go(self.store)
                    await self._back_off(queue, self._delay(1))
                    continue
                await self._record(key, queue, name, ok=False,
                                   error=f"cut short for replies {cut} times; left for the next turn")
                return None
            except _LockBusy:
                log.info("job %s for %s/%s skipped: another worker holds the session", name, *key)
                return None
            except OutputRejected as exc:  # the model answered unusably; nothing was stored, no retry
                log.warning("job %s for %s/%s rejected the model's output: %s", name, *key, exc.reason)
                await self._count_steps(key, queue, steps)
                await self._record(key, queue, name, ok=False, error=exc.reason[:500], rejected=True)
                return None
            except Exception as exc:
                counted = await self._count_steps(key, queue, steps) or counted
                failures = _failures(exc, name)
                if attempt < attempts:
                    for failed, error in failures:
                        log.warning("job %s for %s/%s failed (attempt %d/%d): %s",
                                    failed, *key, attempt, attempts, error)
                    await let_go(self.store)
                    await self._back_off(queue, self._delay(attempt))
                    attempt += 1
                    continue
                for failed, error in failures:
                    log.error("job %s for %s/%s gave up after %d attempts: %s", failed, *key, attempts, error)
                    await self._record(key, queue, failed, ok=False, error=f"after {attempts} attempts: {error}")
                return None
            queue.settled = True
            return await self._count_steps(key, queue, steps) or counted
        return None

    async def _back_off(self, queue: _SessionQueue, delay: float) -> None:
        """Wait before the running job's next attempt (`_SessionQueue.retrying` meanwhile)."""
        queue.retrying = True
        try:
            await self._sleep(delay)
        finally:
            queue.retrying = False

    async def _count_steps(self, key: tuple[str, str], queue: _SessionQueue, steps: list[_Step]) -> bool:
        """Count the steps an attempt reported (`report_step`); True when there were any."""
        reported, steps[:] = list(steps), []
        for step in reported:
            await self._record(key, queue, step.name, ok=step.ok, error=step.error, rejected=step.rejected)
        return bool(reported)

    async def _attempt(self, key: tuple[str, str], name: str, factory: JobFactory, queue: _SessionQueue) -> None:
        """One attempt under the session lock. The lock stays held for the next waiting job while
        that job's attempt, timeout included, still ends before the lock expires (one lock and
        one release per burst of jobs instead of per job); a failed attempt releases it."""
        if self.store is None:
            await self._call(name, factory)
            return
        await self._lock(key, queue)
        try:
            await self._call(name, factory)
        except BaseException:
            await self._unlock(queue)
            raise
        if not queue.waiting and self._batches.of(self.store) is None:
            await self._unlock(queue)  # else released with the burst's outcomes (`_count`)

    async def _lock(self, key: tuple[str, str], queue: _SessionQueue) -> None:
        """Hold the session lock in ``queue.lock`` (kept, or taken anew); `_LockBusy` if another
        worker keeps it for every try."""
        if queue.lock is not None:
            if time.monotonic() < queue.lock_fits_until:
                return
            await self._unlock(queue)
        assert self.store is not None
        settings = self.settings
        for attempt in range(1, settings.lock_attempts + 1):
            taken = time.monotonic()  # before asking: the lock expires no sooner than taken + ttl
            held = self.store.lock(SessionKey(*key), ttl_s=settings.lock_ttl_s)
            try:
                handle = await held.__aenter__()
            except LockNotAcquired:
                if attempt < settings.lock_attempts:
                    await let_go(self.store)
                    await self._sleep(self._delay(attempt))
                continue
            queue.lock, queue.handle = held, handle
            queue.lock_fits_until = (
                taken + settings.lock_ttl_s - settings.timeout_s if settings.timeout_s is not None else 0.0
            )
            return
        raise _LockBusy

    @staticmethod
    async def _unlock(queue: _SessionQueue) -> None:
        held, queue.lock, queue.handle = queue.lock, None, None
        if held is not None:
            await held.__aexit__(None, None, None)

    async def _call(self, name: str, factory: JobFactory) -> None:
        if self.settings.timeout_s is None:
            await self._counted(name, factory)
        else:
            # In this task, not a task of its own (`wait_for`'s): the attempt's store calls use
            # the burst's connection.
            limit = asyncio.timeout(self.settings.timeout_s)
            try:
                async with limit:
                    with waits_excluded(limit):  # a model call's wait for a slot is not the job's time
                        await self._counted(name, factory)
            except TimeoutError:
                if not limit.expired():
                    raise  # the job's own, not the attempt's limit
                raise TimeoutError(
                    f"the attempt took longer than {self.settings.timeout_s:g} s (CONTEXTMODE_JOB_TIMEOUT_S)"
                ) from None

    async def _counted(self, name: str, factory: JobFactory) -> None:
        """One attempt; an exception it raises is a failed attempt for the hooks."""
        try:
            await factory()
        except ModelPreempted:
            raise  # cut short or deferred for replies: not a failed attempt
        except Exception as exc:
            if self.hooks is not None:
                for failed, _ in _failures(exc, name):
                    self.hooks.job_failed(failed)
            raise

    async def _record(
        self, key: tuple[str, str], queue: _SessionQueue, name: str, *, ok: bool, error: str | None = None,
        rejected: bool = False,
    ) -> None:
        if self.store is None:
            return
        if self._batches.of(self.store) is not None:  # counted with the rest of the burst (`_count`)
            queue.outcomes.append(JobOutcome(job=name, ok=ok, error=error, rejected=rejected, finished_at=utc_now()))
            return
        try:
            await self.store.record_job(SessionKey(*key), name, ok=ok, error=error, rejected=rejected)
        except Exception as exc:  # stats are best effort; the job's own result stands
            log.warning("could not record job %s for %s/%s: %s", name, *key, exc)

    async def _count(self, key: tuple[str, str], queue: _SessionQueue) -> None:
        """Count the session's uncounted outcomes in one write (best effort, like `_record`);
        when no job waits, the session lock is released in that same write."""
        outcomes, queue.outcomes = queue.outcomes, []
        batches = self._batches.of(self.store)
        if batches is None:
            return
        release = queue.handle if not queue.waiting else None
        if outcomes or release is not None:
            queue.counting = tuple(outcomes)
            try:
                await batches.record_jobs(SessionKey(*key), outcomes, release=release)
            except Exception as exc:
                log.warning("could not record jobs %s for %s/%s: %s", ",".join(o.job for o in outcomes), *key, exc)
            finally:
                queue.counting = ()
        if release is not None:
            try:
                await self._unlock(queue)  # the store released it already: no second write
            except Exception as exc:  # the job is done; the lock expires after its ttl
                log.warning("could not release the job lock of %s/%s: %s", *key, exc)
