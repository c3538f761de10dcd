"""Running a turn for a route: image cleanup and metrics, whole or streamed.

Both chat routes (`/v1/sessions/{id}/messages` and the OpenAI proxy) go through
here, so the rules are written once: image files are deleted whatever happens,
a streamed turn is prepared before the response starts (errors found while
preparing still get a proper error response), and a stream that ends early is
closed so the engine stores the partial answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, Literal

from starlette.responses import Response

from ..engine import Engine, TurnEvent, TurnResult
from ..errors import InputError, ModelError
from ..types import require_text
from .codes import MessageTooLong
from .idempotency import Claim
from .images import ImageFiles
from .metrics import ServiceMetrics
from .responses import exception_response
from .settings import ServiceSettings
from .sse import SSEResponse
from .state import AppState

__all__ = [
    "Interrupted",
    "StartedStream",
    "TurnOutcome",
    "check_message",
    "coalesce",
    "interrupted_response",
    "run_turn",
    "serve_turn",
    "start_stream",
    "with_system_prompt",
]

# C0 controls but tab, newline and carriage return, and DEL: never text a user typed, and
# PostgreSQL refuses NUL in text, so they are refused here rather than failing in the store.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# A lone UTF-16 surrogate (JSON "\ud800") is no character at all: no store can keep it.
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def check_message(message: str, settings: ServiceSettings) -> None:
    """Raise `EmptyMessage` (40005), `MessageTooLong` (40002) or `InputError` (40001) for a
    message the service refuses."""
    require_text(message)
    if len(message) > settings.max_message_chars:
        raise MessageTooLong(f"the message has {len(message)} characters; at most {settings.max_message_chars}")
    if found := _SURROGATE.search(message):
        raise InputError(
            f"the message contains a lone surrogate U+{ord(found.group()):04X} at position {found.start()}; "
            "send valid Unicode text"
        )
    if found := _CONTROL.search(message):
        raise InputError(
            f"the message contains the control character U+{ord(found.group()):04X} at position {found.start()}; "
            "only tab, newline and carriage return are allowed"
        )


def with_system_prompt(engine: Engine, text: str | None) -> Engine:
    """``engine`` with ``text`` as this request's system prompt (the proxies' ``system`` message).

    The system prompt is per engine; a shallow copy shares the store, model and job runner.
    """
    engine = copy.copy(engine)
    engine.system_prompt = text
    return engine


Outcome = Literal["ok", "partial", "error", "client_gone"]


@dataclass
class TurnOutcome:
    """How a streamed turn ended; counted in the metrics when the stream closes."""

    mode: str
    outcome: Outcome = "client_gone"

    def finished(self, result: TurnResult, metrics: ServiceMetrics) -> None:
        self.outcome = "partial" if result.partial else "ok"
        metrics.observe_turn(result, outcome=self.outcome)


class Interrupted(Exception):
    """The model failed after the user turn was stored; ``partial`` is the answer stored so far."""

    def __init__(self, error: ModelError, partial: str) -> None:
        super().__init__(str(error))
        self.error = error
        self.partial = partial


async def run_turn(
    engine: Engine, tenant: str, session_id: str, message: str, *, mode: Any, images: ImageFiles,
    metrics: ServiceMetrics, user_id: str | None = None,
) -> TurnResult:
    """The whole turn; the images are deleted before this returns or raises.

    A `ModelError` after the user turn was stored is raised as `Interrupted`,
    carrying the partial answer the engine stored, so the client sees it.
    """
    result: TurnResult | None = None
    stored = False
    pieces: list[str] = []
    try:
        async for event in engine.stream(
            tenant, session_id, message, mode=mode, metadata=images.metadata(), user_id=user_id
        ):
            if event.kind == "prepared":
                stored = True  # the engine stores the user turn as soon as this event is taken
            elif event.kind == "delta":
                pieces.append(event.text)
            elif event.kind == "done":
                result = event.result
    except ModelError as exc:
        metrics.count_turn(mode, "error")
        if stored:
            raise Interrupted(exc, "".join(pieces)) from exc
        raise
    finally:
        images.cleanup()
    assert result is not None
    metrics.observe_turn(result, outcome="partial" if result.partial else "ok")
    return result


async def coalesce(
    events: AsyncIterator[TurnEvent], *, flush_ms: int, flush_bytes: int
) -> AsyncIterator[TurnEvent]:
    """Merge ``delta`` events: one is sent at most every ``flush_ms`` or once ``flush_bytes`` wait.

    A fast model otherwise costs one event (JSON, a socket write) per token and,
    when its tokens are already buffered, never lets the event loop serve anyone
    else. A pump task reads ``events`` and yields to the loop after each one; this
    generator wakes only to send (the first delta after a pause starts the
    ``flush_ms`` clock). Other events pass through in order, after the text before them.
    """
    buffer: list[TurnEvent] = []
    size = 0
    wake = asyncio.Event()
    ended: list[BaseException | None] = []

    async def pump() -> None:
        nonlocal size
        try:
            async for event in events:
                first = not buffer
                buffer.append(event)
                if event.kind == "delta":
                    size += len(event.text)
                if first or event.kind != "delta" or size >= flush_bytes or flush_ms == 0:
                    wake.set()
                await asyncio.sleep(0)  # let other requests in between two deltas
        except Exception as exc:
            ended.append(exc)
        else:
            ended.append(None)
        wake.set()

    def drain() -> list[TurnEvent]:
        nonlocal size
        out: list[TurnEvent] = []
        for event in buffer:
            if event.kind == "delta" and out and out[-1].kind == "delta":
                out[-1] = TurnEvent(kind="delta", text=out[-1].text + event.text)
            else:
                out.append(event)
        buffer.clear()
        size = 0
        return out

    task = asyncio.create_task(pump())
    try:
        while True:
            if not buffer and not ended:
                wake.clear()
                await wake.wait()
            only_text = all(e.kind == "delta" for e in buffer)
            if buffer and only_text and size < flush_bytes and flush_ms > 0 and not ended:
                wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), flush_ms / 1000)
            for event in drain():
                yield event
            if ended and not buffer:
                if ended[0] is not None:
                    raise ended[0]
                return
    finally:
        if not task.done():
            task.cancel()
        with contextlib.suppress(BaseException):
            await task


@dataclass
class StartedStream:
    """A streamed turn past its ``prepared`` event."""

    first: TurnEvent
    """The ``prepared`` event (context, detection, rewrite)."""
    events: AsyncIterator[TurnEvent]
    """The rest: ``delta`` events, then ``done`` (or a raised `ModelError`)."""
    outcome: TurnOutcome
    close: Callable[[], Awaitable[None]]
    """Closes the engine's stream (storing a partial answer), deletes the images, counts the turn."""


async def start_stream(
    engine: Engine, tenant: str, session_id: str, message: str, *, mode: Any, images: ImageFiles,
    metrics: ServiceMetrics, user_id: str | None = None,
) -> StartedStream:
    """Prepare the turn; on failure delete the images and raise (the caller answers with an error)."""
    stream: Any = None
    try:
        stream = engine.stream(
            tenant, session_id, message, mode=mode, metadata=images.metadata(), user_id=user_id
        )
        first = await anext(stream)
    except BaseException:
        try:
            if stream is not None:
                await stream.aclose()
        finally:
            images.cleanup()
        raise
    outcome = TurnOutcome(mode=mode)
    metrics.active_streams.inc()

    async def close() -> None:
        try:
            await stream.aclose()
        finally:
            images.cleanup()
            metrics.active_streams.dec()
            if outcome.outcome in ("client_gone", "error"):
                metrics.count_turn(mode, outcome.outcome)

    return StartedStream(first=first, events=stream, outcome=outcome, close=close)


def interrupted_response(path: str, stop: Interrupted) -> Response:
    """The model's error, carrying the partial answer that was stored (``data.partial_answer``)."""
    return exception_response(path, stop.error, {"partial_answer": stop.partial, "interrupted": True})


async def serve_turn(
    state: AppState,
    tenant: str,
    session_id: str,
    held: Claim | None,
    *,
    whole: Callable[[], Awaitable[Response]] | None,
    streamed: Callable[[], Awaitable[tuple[StartedStream, AsyncIterator[bytes]]]],
    headers: dict[str, str] | None = None,
) -> Response:
    """Run one turn as the session's only turn, and keep its response for ``held``'s retries.

    ``whole`` (``None`` for a stream) runs the turn and builds the response;
    ``streamed`` starts a stream and gives its events. The session's turn lock is
    held until the response is built, or for a stream until it closes; the
    idempotency key is released if the turn fails before a response exists.
    """
    try:
        if whole is not None:
            async with state.gate.hold(tenant, session_id):
                response = await whole()
                if held is not None:
                    await held.finish(response)
                return response
        serial = AsyncExitStack()
        await serial.enter_async_context(state.gate.hold(tenant, session_id))
        try:
            started, events = await streamed()
        except BaseException:
            await serial.aclose()
            raise
    except BaseException:
        if held is not None:
            await held.release()
        raise

    async def close() -> None:
        try:
            await started.close()
            if held is not None:
                await held.finish_stream()
        finally:
            await serial.aclose()

    return SSEResponse(
        held.record(events) if held is not None else events,
        on_close=close,
        headers=headers,
        ping_s=state.settings.sse_ping_s,
    )
