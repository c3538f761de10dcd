"""Large JSON bodies are parsed off the event loop.

FastAPI parses a request's JSON on the event loop; a 9.6 MB tool result takes tens of
milliseconds of one core, during which no other request (not even ``/healthz``) is
served, and two clients sending them back to back stall everyone. Bodies of at least
`OFF_LOOP_BYTES` are parsed in a worker thread instead: the decoder still holds the GIL,
but the interpreter switches threads every few milliseconds, so the loop keeps serving.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

__all__ = ["OFF_LOOP_BYTES", "OffLoopJsonRoute"]

OFF_LOOP_BYTES = 256 * 1024
"""Bodies this large or larger are parsed in a thread (smaller ones cost less than the hand-off)."""


class _OffLoopJsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            self._json = await asyncio.to_thread(json.loads, body) if len(body) >= OFF_LOOP_BYTES else json.loads(body)
        return self._json


class OffLoopJsonRoute(APIRoute):
    """A route whose JSON body, when large, is parsed off the event loop (`OFF_LOOP_BYTES`)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def run(request: Request) -> Response:
            return await handler(_OffLoopJsonRequest(request.scope, request.receive))

        return run
