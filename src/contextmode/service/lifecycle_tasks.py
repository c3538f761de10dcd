"""Background work of a service worker for the data lifecycle (docs/lifecycle.md).

- finish forgets a crash cut off (once, at start);
- follow the deletion log and drop this worker's copies of erased sessions
  (every ``CONTEXTMODE_FORGET_SYNC_S`` seconds);
- enforce the retention policies (every ``CONTEXTMODE_RETENTION_INTERVAL_S``
  seconds, only when a policy is set: off by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from ..lifecycle.forget import resume_forgets
from ..lifecycle.retention import RetentionSettings, enforce_retention
from ..lifecycle.sync import ForgetWatcher
from ..store.lifecycle import is_lifecycle_store
from .state import AppState

__all__ = ["lifecycle_tasks"]

log = logging.getLogger("contextmode.lifecycle")


async def _every(seconds: float, name: str, step: Callable[[], Awaitable[None]]) -> None:
    while True:
        await asyncio.sleep(seconds)
        try:
            await step()
        except Exception as exc:  # a store hiccup must not stop the loop
            log.warning("%s failed: %s: %s", name, type(exc).__name__, exc)


@contextlib.asynccontextmanager
async def lifecycle_tasks(state: AppState, retention: RetentionSettings | None = None) -> AsyncIterator[None]:
    """Run the lifecycle loops while the app runs."""
    engine, settings, metrics = state.engine, state.settings, state.metrics
    if not is_lifecycle_store(engine.store):
        yield
        return
    tasks: list[asyncio.Task[None]] = []
    try:
        for record in await resume_forgets(engine.store, caches=[engine], image_dir=settings.image_dir):
            log.info("resumed forget %d (%s %s): %s", record.id, record.scope, record.target, dict(record.counts))
    except Exception as exc:
        log.warning("could not resume unfinished forgets: %s: %s", type(exc).__name__, exc)
    if settings.forget_sync_s > 0:
        watcher = ForgetWatcher(engine.store, engine)

        async def sync() -> None:
            before = dict(watcher.dropped)
            await watcher.poll()
            metrics.count_erased("sync", {k: v - before.get(k, 0) for k, v in watcher.dropped.items()})

        tasks.append(asyncio.create_task(_every(settings.forget_sync_s, "forget sync", sync)))
    retention = retention or RetentionSettings.from_env()
    if retention.enabled:
        async def enforce() -> None:
            try:
                counts = await enforce_retention(engine.store, retention, caches=[engine])
            except Exception:
                metrics.retention_runs.labels(outcome="error").inc()
                raise
            metrics.retention_runs.labels(outcome="ok").inc()
            metrics.retention_last_run.set(time.time())
            metrics.count_erased("retention", counts)

        tasks.append(asyncio.create_task(_every(retention.interval_s, "retention", enforce)))
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
