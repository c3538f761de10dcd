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
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Literal

from starlette.responses import Response

from ..engine import Delta, Engine, PreparedTurn, TurnEvent, TurnRequest, TurnResult
from ..engine.agent import ToolResult
from ..errors import InputError, ModelError
from ..types import SessionKey, require_text
from .client_gone import ClientGone, client_watch
from .codes import MessageTooLong
from .idempotency import Claim, claim
from .images import ImageFiles
from .metrics import ServiceMetrics
from .responses import exception_response
from .settings import ServiceSettings
from .sse import SSEResponse
from .state import AppState

__all__ = [
    "Interrupted",
    "StartedStream",
    "Streamed",
    "Whole",
    "check_message",
    "check_tool_results",
    "coalesce",
    "interrupted_response",
    "run_events",
    "run_turn",
    "serve_once",
    "serve_turn",
    "start_events",
    "start_stream",
    "step_runners",
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


def check_tool_results(results: Sequence[ToolResult], settings: ServiceSettings) -> None:
    """Raise `MessageTooLong` (40002) for a tool result longer than the service accepts: tool
    results count against the limits as messages do (``CONTEXTMODE_MAX_TOOL_RESULT_CHARS``)."""
    most = settings.max_tool_result_chars
    for result in results:
        if len(result.content) > most:
            raise MessageTooLong(
                f"the result of tool call {result.call_id[:64]!r} has {len(result.content)} characters; at most {most}"
            )


Outcome = Literal["ok", "partial", "error", "client_gone"]


class Interrupted(Exception):
    """The model failed after the user turn was stored; ``partial`` is the answer stored so far."""

    def __init__(self, error: ModelError, partial: str) -> None:
        super().__init__(str(error))
        self.error = error
        self.partial = partial


def _mode(engine: Engine, request: TurnRequest) -> str:
    return request.mode or engine.settings.mode


async def run_turn(engine: Engine, request: TurnRequest, *, images: ImageFiles, metrics: ServiceMetrics) -> TurnResult:
    """The whole turn; the images are deleted before this returns or raises.

    A model failure after the user turn was stored is raised as `Interrupted`,
    carrying the partial answer the engine stored, so the client sees it.
    """
    return await run_events(engine.stream(request), _mode(engine, request), images=images, metrics=metrics)


async def run_events(
    stream: AsyncIterator[TurnEvent], mode: str, *, images: ImageFiles, metrics: ServiceMetrics
) -> TurnResult:
    """`run_turn` for a stream already opened (``Engine.stream_agent``'s): read it to its end and
    count the outcome (``ok``, ``partial`` or ``error``); `Interrupted` on ``Failed``."""
    last: TurnEvent | None = None
    try:
        async for event in stream:
            last = event
    except ModelError:  # raised while preparing: nothing was stored
        metrics.count_turn(mode, "error")
        raise
    finally:
        images.cleanup()
    if last is not None and last.kind == "failed":
        metrics.count_turn(mode, "error")
        raise Interrupted(last.error, last.partial_answer) from last.error
    assert last is not None and last.kind == "done", "a turn's stream ends with done or failed"
    metrics.observe_turn(last.result, outcome="partial" if last.result.partial else "ok")
    return last.result


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
                out[-1] = Delta(text=out[-1].text + event.text)
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


@dataclass(frozen=True, kw_only=True)
class StartedStream:
    """A streamed turn past its ``Prepared`` event."""

    prepared: PreparedTurn
    """What the turn sends the model (context, detection, rewrite)."""
    events: AsyncIterator[TurnEvent]
    """The rest: ``Delta`` events, then ``Done`` or ``Failed`` (or a raised error)."""
    close: Callable[[], Awaitable[None]]
    """Closes the engine's stream (storing a partial answer), deletes the images, counts the turn."""


async def start_stream(
    engine: Engine, request: TurnRequest, *, images: ImageFiles, metrics: ServiceMetrics
) -> StartedStream:
    """Prepare the turn; on failure delete the images and raise (the caller answers with an error).

    The turn is counted here, whatever the route does with its events: ``ok`` or ``partial``
    at ``Done``, ``error`` at ``Failed`` or an exception, ``client_gone`` when it is closed first.
    """
    return await start_events(engine.stream(request), _mode(engine, request), images=images, metrics=metrics)


async def start_events(
    stream: AsyncIterator[TurnEvent], mode: str, *, images: ImageFiles, metrics: ServiceMetrics
) -> StartedStream:
    """`start_stream` for a stream already opened (``Engine.stream_agent``'s): read its ``Prepared``
    event (on failure close it, delete the images and raise), then count it as `start_stream` does."""
    try:
        first = await anext(stream)
    except BaseException:
        try:
            await stream.aclose()  # type: ignore[attr-defined]
        finally:
            images.cleanup()
        raise
    assert first.kind == "prepared"
    outcome: list[Outcome] = ["client_gone"]
    metrics.active_streams.inc()

    async def counted() -> AsyncIterator[TurnEvent]:
        try:
            async for event in stream:
                if event.kind == "done":
                    outcome[0] = "partial" if event.result.partial else "ok"
                    metrics.observe_turn(event.result, outcome=outcome[0])
                elif event.kind == "failed":
                    outcome[0] = "error"
                yield event
        except Exception:
            outcome[0] = "error"
            raise

    async def close() -> None:
        try:
            await stream.aclose()  # type: ignore[attr-defined]
        finally:
            images.cleanup()
            metrics.active_streams.dec()
            if outcome[0] in ("client_gone", "error"):
                metrics.count_turn(mode, outcome[0])

    return StartedStream(prepared=first.prepared, events=counted(), close=close)


Whole = Callable[[], Awaitable[Response]]
"""Runs a turn and builds its whole (JSON) response."""
Streamed = Callable[[], Awaitable[tuple[StartedStream, AsyncIterator[bytes]]]]
"""Starts a streamed turn and gives its events as the route's SSE bytes."""


def step_runners(
    open_events: Callable[[], AsyncIterator[TurnEvent]],
    mode: str,
    metrics: ServiceMetrics,
    *,
    json: Callable[[TurnResult], Response],
    body: Callable[[StartedStream, AsyncIterator[TurnEvent]], AsyncIterator[bytes]],
) -> tuple[Whole, Streamed]:
    """`serve_turn`'s two runners for an agent step (``open_events`` opens ``Engine.stream_agent``),
    counted like a chat turn: ``json`` builds the whole answer's response (a model failure is raised
    as its error), ``body`` turns a started stream's events into the route's SSE bytes."""

    async def whole() -> Response:
        try:
            result = await run_events(open_events(), mode, images=ImageFiles(), metrics=metrics)
        except Interrupted as stop:
            raise stop.error from None
        return json(result)

    async def streamed() -> tuple[StartedStream, AsyncIterator[bytes]]:
        # Errors found while preparing answer as errors; then counted like a chat turn's stream.
        started = await start_events(open_events(), mode, images=ImageFiles(), metrics=metrics)
        return started, body(started, started.events)

    return whole, streamed


def interrupted_response(path: str, stop: Interrupted) -> Response:
    """The model's error, carrying the partial answer that was stored (``data.partial_answer``)."""
    return exception_response(path, stop.error, {"partial_answer": stop.partial, "interrupted": True})


async def serve_once(
    state: AppState,
    key: SessionKey,
    idempotency_key: str | None,
    route: str,
    body: str,
    *,
    whole: Whole | None,
    streamed: Streamed,
    headers: dict[str, str] | None = None,
) -> Response:
    """`serve_turn` behind the request's ``Idempotency-Key`` (`claim`): a retry of a finished
    request replays its response; ``route``, the session and ``body`` (the canonical request body)
    tell a retry from a new request."""
    held, replay = await claim(
        state.engine.store, key.tenant, idempotency_key, [route, key.session_id, body], session_id=key.session_id,
        mask=state.engine.settings.pii_for(key.tenant) == "mask",
    )
    if replay is not None:
        return replay
    return await serve_turn(state, key.tenant, key.session_id, held, whole=whole, streamed=streamed, headers=headers)


async def serve_turn(
    state: AppState,
    tenant: str,
    session_id: str,
    held: Claim | None,
    *,
    whole: Whole | None,
    streamed: Streamed,
    headers: dict[str, str] | None = None,
) -> Response:
    """Run one turn as the session's only turn, and keep its response for ``held``'s retries.

    ``whole`` (``None`` for a stream) runs the turn and builds the response;
    ``streamed`` starts a stream and gives its events. The session's turn lock is
    held until the response is built, or for a stream until it closes; the
    idempotency key is released if the turn fails before a response exists.
    """
    # The turn's trace is written once the session's turn lock is released (the reply is
    # ready): its store write never queues ahead of the reply's own.
    # The turn lock, the load, the recall and the user turn share one pooled store connection
    # (`Engine.one_connection`, taken at the lock's statement); the engine lets it go before
    # the model answers, and the gate before it pauses between tries of a busy lock.
    engine = state.engine
    traces = engine.trace_writes
    try:
        if whole is not None:
            with traces.held(tenant, session_id):
                async with engine.one_connection(), state.gate.hold(tenant, session_id):
                    try:
                        async with client_watch():
                            response = await whole()
                    except ClientGone:
                        # Ended (its answer so far stored, partial), the session let go at once.
                        if held is not None:
                            await held.release()
                        return Response(status_code=499)
                    if held is not None:
                        await held.finish(response)
                    return response
        serial = AsyncExitStack()
        serial.enter_context(traces.held(tenant, session_id))
        try:
            async with engine.one_connection():
                await serial.enter_async_context(state.gate.hold(tenant, session_id))
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
        send_timeout_s=state.settings.sse_send_timeout_s or None,
    )
