"""`ForgetWatcher`: a worker drops its in-process copies of sessions another worker erased.

Each worker holds recall indexes, computed summaries and queued jobs of the
sessions it served. The worker that runs a forget clears its own at once; the
others learn of it from the store's deletion log. `poll` reads the records
added since the last poll and probes, in each tenant they name, every session
this process holds: one that is gone (or was re-created after the forget began)
is dropped from every local cache. The service polls every
``CONTEXTMODE_FORGET_SYNC_S`` seconds (default 1).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Protocol

from ..store.base import Store
from ..store.lifecycle import merge_counts
from ..types import SessionKey
from .forget import lifecycle_store

__all__ = ["CacheHolder", "ForgetWatcher"]

_EVERYTHING = datetime.min.replace(tzinfo=UTC)


class CacheHolder(Protocol):
    """What the watcher needs of an engine."""

    def cached_sessions(self) -> Iterable[SessionKey]: ...

    def forget_local(self, key: SessionKey) -> Mapping[str, int]: ...


class ForgetWatcher:
    """Follows the deletion log of ``store`` and clears ``holder``'s caches of erased sessions."""

    def __init__(self, store: Store, holder: CacheHolder) -> None:
        self.store = lifecycle_store(store)
        self.holder = holder
        self.cursor = 0
        """Every deletion record with an id up to this one has been handled."""
        self.dropped: dict[str, int] = {}
        """What was dropped so far, per kind (for metrics and tests)."""

    async def poll(self) -> int:
        """Handle new deletion records; return how many sessions' caches were dropped."""
        started: dict[str, datetime] = {}
        cursor = self.cursor
        while True:
            records = await self.store.deletions(since_id=cursor, limit=500)
            for record in records:
                first = started.get(record.tenant)
                # Retention may prune turns of a session that stays: drop all of the tenant's.
                since = _EVERYTHING if record.scope == "retention" else record.started_at
                started[record.tenant] = min(first, since) if first else since
            # An unfinished forget is looked at again next time: more of it may be gone then.
            pending = [r.id for r in records if r.pending]
            cursor = (min(pending) - 1) if pending else (records[-1].id if records else cursor)
            if pending or len(records) < 500:
                break
        self.cursor = max(self.cursor, cursor)
        return await self._sweep(started) if started else 0

    async def _sweep(self, started: Mapping[str, datetime]) -> int:
        dropped = 0
        for key in sorted(self.holder.cached_sessions()):
            since = started.get(key.tenant)
            if since is None:
                continue
            probe = await self.store.version(key)
            if since == _EVERYTHING or probe.last_seq == 0 or (
                    probe.created_at is not None and probe.created_at >= since):
                merge_counts(self.dropped, self.holder.forget_local(key))
                dropped += 1
        return dropped
