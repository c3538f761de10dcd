"""The exchanges' trace writes, run just after the reply (one ordered chain per session): the
service holds them until its reply is out, readers and erasures settle them first."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

from ..types import SessionKey

__all__ = ["TraceWrites"]


class TraceWrites:
    """The exchanges' trace writes, run just after the reply: one ordered chain per session.

    `add` starts a write after the session's previous one, at once, or when the `held`
    block around the turn ends (the service holds them until its reply is out, so a
    trace write never queues before the reply's own store calls); `settle` starts the
    session's held writes and waits for them (a reader of its traces, or an erasure,
    comes next); `drain` does so for every session (tests, shutdown). A write that fails
    is logged and dropped: the turn is stored either way.
    """

    def __init__(self) -> None:
        self._tails: dict[tuple[str, str], asyncio.Task[None]] = {}
        """Each session's newest write; it finishes after every earlier one of the session."""
        self._held: dict[tuple[str, str], tuple[asyncio.Event, int]] = {}
        """Sessions whose new writes wait: the event that starts them, and how many hold it."""

    def add(self, key: SessionKey, write: Coroutine[Any, Any, None]) -> None:
        """Run ``write`` after the session's pending writes (needs a running event loop)."""
        name = (key.tenant, key.session_id)
        held = self._held.get(name)
        task = asyncio.get_running_loop().create_task(
            _after(held[0] if held else None, self._tails.get(name), write),
            name=f"contextmode-trace:{key.tenant}/{key.session_id}",
        )
        self._tails[name] = task
        task.add_done_callback(lambda done: self._forget(name, done))

    def _forget(self, name: tuple[str, str], done: asyncio.Task[None]) -> None:
        if self._tails.get(name) is done:
            del self._tails[name]

    @contextmanager
    def held(self, tenant: str, session_id: str) -> Iterator[None]:
        """The session's writes added inside the block start when it ends (or when `settle`
        or `drain` asks for them first)."""
        name = (tenant, session_id)
        event, holders = self._held.get(name, (None, 0))
        event = event or asyncio.Event()
        self._held[name] = (event, holders + 1)
        try:
            yield
        finally:
            current = self._held.get(name)
            if current is not None and current[0] is event:  # else a reader already started them
                if current[1] <= 1:
                    del self._held[name]
                    event.set()
                else:
                    self._held[name] = (event, current[1] - 1)

    def _release(self, name: tuple[str, str]) -> None:
        held = self._held.pop(name, None)
        if held is not None:
            held[0].set()

    def pending(self, tenant: str, session_id: str) -> bool:
        """True while a trace of the session is still to be written."""
        return (tenant, session_id) in self._tails

    async def settle(self, tenant: str, session_id: str) -> None:
        """Wait until the session's pending trace writes are done, held ones included (a
        cancelled caller stops waiting; the writes go on)."""
        name = (tenant, session_id)
        self._release(name)
        tail = self._tails.get(name)
        if tail is not None and not tail.done():
            await asyncio.wait([tail])

    async def drain(self) -> None:
        """Wait until every pending trace write is done, held ones included."""
        while self._tails:
            for name in list(self._held):
                self._release(name)
            await asyncio.wait(list(self._tails.values()))

    async def aclose(self) -> None:
        """Cancel the pending writes (shutdown that could not wait for them)."""
        tasks = list(self._tails.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tails.clear()


async def _after(
    hold: asyncio.Event | None, previous: asyncio.Task[None] | None, write: Coroutine[Any, Any, None]
) -> None:
    """``write``, once ``hold`` is set and ``previous`` is done: a session's traces are
    written in turn order."""
    try:
        if hold is not None and not hold.is_set():
            await hold.wait()
        if previous is not None and not previous.done():
            await asyncio.wait([previous])
    except BaseException:  # cancelled while waiting (shutdown): the write never starts
        write.close()
        raise
    await write
