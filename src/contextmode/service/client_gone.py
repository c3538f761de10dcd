"""A turn whose client has gone ends at once and lets its session go.

A client that stops waiting for a whole (not streamed) answer (its own timeout, a closed tab)
leaves the turn generating for nobody: on a shared local model that holds up every other
session's replies, and the session's turn lock with it, so the client's next message got 409
"busy". A stream already stops when its client leaves (`sse.SSEResponse`); a whole answer now
does too: `_EdgeMiddleware` hands each request's ASGI ``receive`` to `client_watch` (a context
variable), which, once the route has read the body, waits for the client's ``http.disconnect``
and then cancels the turn. The engine stores the answer so far, marked partial, as for a
stream cut short; the turn lock is released; the response, never read, is a 499.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from contextvars import ContextVar, Token

from starlette.types import Receive

__all__ = ["ClientGone", "client_watch", "watching"]

_RECEIVE: ContextVar[Receive | None] = ContextVar("contextmode_receive", default=None)


class ClientGone(Exception):
    """The client disconnected before its answer was ready (the turn was ended)."""


def watching(receive: Receive) -> Token[Receive | None]:
    """Make ``receive`` the request's for `client_watch` (reset with the token when it ends)."""
    return _RECEIVE.set(receive)


def reset(token: Token[Receive | None]) -> None:
    _RECEIVE.reset(token)


@asynccontextmanager
async def client_watch() -> AsyncIterator[None]:
    """Run the block, cancelled if the request's client disconnects meanwhile (raises
    `ClientGone` then). The request's body must be read already; outside a request: no watch."""
    receive = _RECEIVE.get()
    task = asyncio.current_task()
    if receive is None or task is None:
        yield
        return
    gone = False

    async def watch() -> None:
        nonlocal gone
        while (await receive())["type"] != "http.disconnect":
            pass
        gone = True
        task.cancel()

    watcher = asyncio.get_running_loop().create_task(watch(), name="contextmode-client-watch")
    try:
        yield
    except asyncio.CancelledError:
        if not gone:
            raise
        task.uncancel()
        raise ClientGone("the client disconnected before its answer was ready") from None
    finally:
        watcher.cancel()
