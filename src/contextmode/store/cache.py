"""`SessionCache`: a bounded LRU of loaded session states for one process.

Every `get` first takes the store's one-row `version()` probe and serves the
cached state only when the probe is unchanged since that state was loaded, so
a write by another process (or worker) is never hidden by the cache. Entries
idle longer than ``idle_s`` are evicted; nothing is lost by eviction because
the store already holds everything.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ConfigError
from ..types import SessionKey, SessionState
from .base import SessionVersion, Store

__all__ = ["CacheStats", "SessionCache"]

_Key = tuple[SessionKey, int, int, int, float]


@dataclass(frozen=True, kw_only=True)
class CacheStats:
    """Counters since the cache was made."""

    hits: int
    """States served from memory after an unchanged version probe."""
    misses: int
    """States loaded from the store (absent, changed or idle)."""
    evictions: int
    """Entries dropped for size or idleness."""
    size: int
    """Entries held now."""


@dataclass
class _Entry:
    version: SessionVersion
    state: SessionState
    used_at: float


class SessionCache:
    """Active `SessionState`s of this process, at most ``max_sessions``, idle ≤ ``idle_s`` seconds.

    Load options (``recent``, ``max_uncovered``, ``key_moments``,
    ``key_moment_threshold``) are part of the cache key, exactly as `Store.load`
    takes them. ``clock`` returns seconds (monotonic); tests pass a fake.
    """

    def __init__(
        self,
        store: Store,
        *,
        max_sessions: int = 1024,
        idle_s: float = 1800.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_sessions < 1:
            raise ConfigError("max_sessions must be at least 1")
        self.store = store
        self.max_sessions = max_sessions
        self.idle_s = idle_s
        self._clock = clock
        self._entries: OrderedDict[_Key, _Entry] = OrderedDict()
        self._hits = self._misses = self._evictions = 0

    async def get(
        self,
        key: SessionKey,
        *,
        recent: int = 8,
        max_uncovered: int = 200,
        key_moments: int = 0,
        key_moment_threshold: float = 0.7,
    ) -> SessionState:
        """The session's state, from memory if the store says nothing changed since."""
        entry_key: _Key = (key, recent, max_uncovered, key_moments, key_moment_threshold)
        now = self._clock()
        self.evict_idle(now)
        # The probe is taken before the load: a write landing in between makes the
        # next probe differ, so the worst case is one extra load, never a stale state.
        probe = await self.store.version(key)
        entry = self._entries.get(entry_key)
        if entry is not None and entry.version == probe:
            entry.used_at = now
            self._entries.move_to_end(entry_key)
            self._hits += 1
            return entry.state
        self._misses += 1
        state = await self.store.load(
            key,
            recent=recent,
            max_uncovered=max_uncovered,
            key_moments=key_moments,
            key_moment_threshold=key_moment_threshold,
        )
        self._entries[entry_key] = _Entry(version=probe, state=state, used_at=now)
        self._entries.move_to_end(entry_key)
        while len(self._entries) > self.max_sessions:
            self._entries.popitem(last=False)
            self._evictions += 1
        return state

    def invalidate(self, key: SessionKey) -> int:
        """Forget every cached state of the session; return how many were dropped."""
        doomed = [k for k in self._entries if k[0] == key]
        for entry_key in doomed:
            del self._entries[entry_key]
        return len(doomed)

    def evict_idle(self, now: float | None = None) -> int:
        """Drop entries unused for more than ``idle_s`` seconds; return how many."""
        now = self._clock() if now is None else now
        evicted = 0
        # Least recently used first: stop at the first entry still fresh.
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            if now - entry.used_at <= self.idle_s:
                break
            del self._entries[key]
            evicted += 1
        self._evictions += evicted
        return evicted

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def stats(self) -> CacheStats:
        return CacheStats(
            hits=self._hits, misses=self._misses, evictions=self._evictions,
            size=len(self._entries),
        )
