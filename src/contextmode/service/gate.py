"""One turn at a time per session: a short local queue, then the store's turn lock.

Two turns of one session running at once would store ``user, user, assistant,
assistant`` and every later turn would send the model that jumble. A turn
therefore waits (FIFO within a worker, polling the store's `TurnLocks` across
workers) for at most ``session_wait_ms`` and then fails with `SessionBusy`
(40902). A store without `TurnLocks` gets the local queue only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TypeGuard

from .._protocols import implements
from ..errors import LockNotAcquired
from ..store.base import LockHandle, Store, StoreAbility, TurnLocks, let_go
from ..types import SessionKey

__all__ = ["SessionBusy", "SessionGate"]

log = logging.getLogger("contextmode.service")

_POLL_S = (0.01, 0.02, 0.05, 0.1)
"""Back-off between tries of the store's lock; the last step repeats."""


class SessionBusy(LockNotAcquired):
    """Another turn of the session is still running after the wait (40902)."""


class SessionGate:
    """Serialises the turns of each session of one worker, and across workers through the store."""

    def __init__(self, store: Store, *, wait_ms: int, ttl_s: float = 300.0) -> None:
        self.store = store
        self.wait_s = wait_ms / 1000
        self.ttl_s = ttl_s
        self._local: dict[tuple[str, str], tuple[asyncio.Lock, int]] = {}
        self._orphans: dict[tuple[str, str], LockHandle] = {}
        self._locks = StoreAbility(has_turn_locks, store)

    @asynccontextmanager
    async def hold(self, tenant: str, session_id: str) -> AsyncIterator[None]:
        """Run the body as the session's only turn; raise `SessionBusy` after the wait."""
        deadline = time.monotonic() + self.wait_s
        key = (tenant, session_id)
        lock, users = self._local.get(key, (asyncio.Lock(), 0))
        self._local[key] = (lock, users + 1)
        try:
            try:
                await asyncio.wait_for(lock.acquire(), max(0.0, deadline - time.monotonic()) or 0.001)
            except TimeoutError:
                raise SessionBusy(_busy(session_id)) from None
            try:
                async with self._store_lock(tenant, session_id, deadline):
                    yield
            finally:
                lock.release()
        finally:
            lock, users = self._local[key]
            if users <= 1:
                del self._local[key]
            else:
                self._local[key] = (lock, users - 1)

    @asynccontextmanager
    async def _store_lock(self, tenant: str, session_id: str, deadline: float) -> AsyncIterator[None]:
        locks = self._locks.of(self.store)
        if locks is None:
            yield
            return
        orphan = self._orphans.pop((tenant, session_id), None)
        if orphan is not None:  # our own lock, left when the store was unreachable at release
            try:
                await locks.release_turn_lock(orphan)
            except Exception:
                self._orphans[(tenant, session_id)] = orphan
        step = 0
        while True:
            held: AbstractAsyncContextManager[LockHandle] = locks.turn_lock(
                SessionKey(tenant, session_id), ttl_s=self.ttl_s
            )
            try:
                handle = await held.__aenter__()
            except LockNotAcquired:
                pause = _POLL_S[min(step, len(_POLL_S) - 1)]
                if time.monotonic() + pause > deadline:
                    raise SessionBusy(_busy(session_id)) from None
                step += 1
                # No pooled connection is kept through the pause (the turn's shared one, if any).
                await let_go(self.store)
                await asyncio.sleep(pause)
                continue
            break
        try:
            yield
        finally:
            try:
                await held.__aexit__(None, None, None)
            except Exception as exc:
                # The turn is done; only the release failed (the store dropped). Remember the
                # handle: the next turn of this session here releases it first, and elsewhere
                # it expires after ``ttl_s``.
                log.warning("turn lock of session %s not released: %s", session_id, type(exc).__name__)
                self._orphans[(tenant, session_id)] = handle


def has_turn_locks(store: object) -> TypeGuard[TurnLocks]:
    """True when ``store`` holds the second, per-turn session lock (`TurnLocks`)."""
    return implements(store, TurnLocks)


def _busy(session_id: str) -> str:
    return f"session {session_id!r} is busy with another turn; retry when it has finished"
