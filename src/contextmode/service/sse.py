"""Server-sent events whose cleanup always runs: when the stream ends, fails, or the client leaves.

Starlette's ``StreamingResponse`` does not close its iterator when the client
disconnects, so a turn's ``finally`` (which stores the partial answer) and
the image cleanup would wait for the garbage collector.
`SSEResponse` streams in a task of its own while it listens for
``http.disconnect``; whichever ends first, it cancels the other, closes the
iterator (which closes the model's request upstream) and then awaits ``on_close``.
With ``ping_s`` an idle stream gets a ``: ping`` comment line every ``ping_s``
seconds, so proxies and load balancers do not cut a slow model's stream.
(``sse-starlette``'s ``EventSourceResponse`` pings too, but on a disconnect it
cancels its task group and leaves the generator's cleanup to the handler, as its
README says; the partial answer and the session's turn lock rely on ``on_close``
running, so the pings were added here instead of a new dependency.)

With ``send_timeout_s`` a client that keeps its socket open but stops reading cannot
hold the turn (and its session's turn lock) for as long as the socket lives: once one
write waits longer than that, nothing more is sent and the rest of the events are read
without sending, so the turn ends as it would have, its whole answer stored, and
``on_close`` releases the session (``stalled`` is then True).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

__all__ = ["DONE", "PING", "SSEResponse", "sse_event"]

log = logging.getLogger("contextmode.http")

DONE = b"data: [DONE]\n\n"
PING = b": ping\n\n"


def sse_event(payload: object) -> bytes:
    """One ``data:`` event holding ``payload`` as compact JSON (UTF-8, no ASCII escapes)."""
    return b"data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


class SSEResponse(Response):
    """A ``text/event-stream`` response over ``events`` with guaranteed ``on_close``."""

    media_type = "text/event-stream"

    def __init__(
        self,
        events: AsyncIterator[bytes],
        *,
        on_close: Callable[[], Awaitable[None]] | None = None,
        headers: dict[str, str] | None = None,
        ping_s: float | None = None,
        send_timeout_s: float | None = None,
    ) -> None:
        self.events = events
        self.on_close = on_close
        self.ping_s = ping_s
        self.send_timeout_s = send_timeout_s
        self.stalled = False
        """True once a write waited longer than ``send_timeout_s``: nothing more is sent."""
        self._sending = asyncio.Lock()
        self._last_sent = time.monotonic()
        self.status_code = 200
        self.background = None
        self.init_headers({"cache-control": "no-cache", "x-accel-buffering": "no", **(headers or {})})
        self.client_gone = False
        """True when the client disconnected before the last event was sent."""

    async def _send(self, send: Send, message: Message) -> None:
        async with self._sending:
            if self.stalled:
                return
            try:
                await asyncio.wait_for(send(message), self.send_timeout_s)
            except TimeoutError:
                self.stalled = True
                log.warning("stream client stopped reading for %.1f s; finishing the turn without it",
                            self.send_timeout_s or 0.0)
                return
            self._last_sent = time.monotonic()

    async def _stream(self, send: Send) -> None:
        await self._send(send, {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        async for chunk in self.events:
            await self._send(send, {"type": "http.response.body", "body": chunk, "more_body": True})
        await self._send(send, {"type": "http.response.body", "body": b"", "more_body": False})

    async def _ping(self, send: Send, every: float) -> None:
        while not self.stalled:
            await asyncio.sleep(max(0.0, self._last_sent + every - time.monotonic()))
            if time.monotonic() - self._last_sent >= every:
                await self._send(send, {"type": "http.response.body", "body": PING, "more_body": True})

    @staticmethod
    async def _until_disconnect(receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        streaming = asyncio.ensure_future(self._stream(send))
        listening = asyncio.ensure_future(self._until_disconnect(receive))
        helpers = [listening]
        if self.ping_s:
            helpers.append(asyncio.ensure_future(self._ping(send, self.ping_s)))
        try:
            await asyncio.wait({streaming, listening}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.client_gone = not streaming.done()
            for task in (streaming, *helpers):
                task.cancel()
            await asyncio.gather(streaming, *helpers, return_exceptions=True)
            try:
                aclose = getattr(self.events, "aclose", None)
                if aclose is not None:
                    with contextlib.suppress(Exception):
                        await aclose()
            finally:
                if self.on_close is not None:
                    await self.on_close()
        if not self.client_gone and streaming.exception() is not None and not isinstance(
            streaming.exception(), OSError
        ):
            raise streaming.exception()  # type: ignore[misc]
