"""A TCP proxy for store fault injection: forwards to PostgreSQL or Redis, and breaks on demand.

Point a store at the proxy instead of the server, then simulate what happens
in production::

    with TcpProxy(5432) as port:                      # listens on 127.0.0.1:<port>
        store = PostgresStore(f"postgresql://postgres@127.0.0.1:{port}/test")
        ...
        proxy.drop_all()      # every open connection is reset (a server restart)
        proxy.refuse()        # stop listening: new connections are refused (server down)
        proxy.delay(0.2)      # each forwarded chunk waits 0.2 s (a slow network)
        proxy.restore()       # listen again on the same port, no delay

The proxy runs its own event loop in a daemon thread, so it keeps forwarding
while the test's loop is blocked in a store call, and its knobs can be turned
from any thread (they return once they have taken effect).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["TcpProxy"]

T = TypeVar("T")

_CHUNK = 65536
"""Bytes read per forwarded chunk."""


class TcpProxy:
    """Forwards ``host:port`` (the proxy) to ``target_host:target_port``; see the module docstring."""

    def __init__(
        self, target_port: int, *, target_host: str = "127.0.0.1", host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.target_host, self.target_port = target_host, target_port
        self.host, self.port = host, port
        self.accepted = 0
        """Connections accepted since start (forwarded or not)."""
        self.dropped = 0
        """Connections reset by `drop_all`."""
        self._delay_s = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None
        self._links: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> int:
        """Start forwarding; returns the port listened on (a free one unless ``port`` was given)."""
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        def run() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="tcp-proxy", daemon=True)
        self._thread.start()
        ready.wait()
        self._call(self._listen())
        return self.port

    def stop(self) -> None:
        """Close the listener and every connection, then stop the thread."""
        if self._loop is None:
            return
        self._call(self._close_listener())
        self._call(self._reset_all())
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._loop.close()
        self._loop = self._thread = None

    def __enter__(self) -> int:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- knobs -----------------------------------------------------------------------------

    @property
    def open_connections(self) -> int:
        """Client connections being forwarded now."""
        return len(self._links)

    @property
    def listening(self) -> bool:
        return self._server is not None

    def drop_all(self) -> int:
        """Reset every open connection (as a restarting server does); returns how many."""
        return self._call(self._reset_all())

    def refuse(self) -> None:
        """Stop listening: new connections are refused (the server is down). Open ones stay;
        call `drop_all` too for a crash."""
        self._call(self._close_listener())

    def delay(self, seconds: float) -> None:
        """Hold each forwarded chunk, in both directions, for ``seconds`` (0 = none)."""
        self._delay_s = max(0.0, seconds)

    def restore(self) -> None:
        """Listen again on the same port, with no delay."""
        self._delay_s = 0.0
        if self._server is None:
            self._call(self._listen())

    # -- internals ---------------------------------------------------------------------------

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._loop is None:
            coro.close()
            raise RuntimeError("the proxy is not running")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.host, self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _close_listener(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _reset_all(self) -> int:
        links = list(self._links)
        for client, upstream in links:
            for writer in (client, upstream):
                _reset(writer)
        self._links.difference_update(links)
        self.dropped += len(links)
        await asyncio.sleep(0)  # let the pumps see their closed transports
        return len(links)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            _reset(writer)
            return
        link = (writer, up_writer)
        self._links.add(link)
        try:
            await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))
        finally:
            self._links.discard(link)
            for w in link:
                with contextlib.suppress(Exception):
                    w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(_CHUNK):
                if self._delay_s:
                    await asyncio.sleep(self._delay_s)
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            # Half-close so the other side sees EOF, as a plain TCP relay would.
            with contextlib.suppress(Exception):
                if writer.can_write_eof():
                    writer.write_eof()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with SO_LINGER 0: the peer gets a TCP RST, not a polite FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
