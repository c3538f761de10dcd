"""Running a turn for a route: image cleanup and metrics, whole or streamed.

Both chat routes (`/v1/sessions/{id}/messages` and the OpenAI proxy) go through
here, so the rules are written once: image files are deleted whatever happens,
a streamed turn is prepared before the response starts (errors found while
preparing still get a proper error response), and a stream that ends early is
closed so the engine stores the partial answer.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from ..engine import Engine, TurnEvent, TurnResult
from ..errors import InputError, ModelError
from .codes import MessageTooLong
from .images import ImageFiles
from .metrics import ServiceMetrics
from .settings import ServiceSettings

__all__ = ["StartedStream", "TurnOutcome", "check_message", "run_turn", "start_stream"]

# C0 controls but tab, newline and carriage return, and DEL: never text a user typed, and
# PostgreSQL refuses NUL in text, so they are refused here rather than failing in the store.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def check_message(message: str, settings: ServiceSettings) -> None:
    """Raise `MessageTooLong` (40002) or `InputError` (40001) for a message the service refuses."""
    if len(message) > settings.max_message_chars:
        raise MessageTooLong(f"the message has {len(message)} characters; at most {settings.max_message_chars}")
    if found := _CONTROL.search(message):
        raise InputError(
            f"the message contains the control character U+{ord(found.group()):04X} at position {found.start()}; "
            "only tab, newline and carriage return are allowed"
        )

Outcome = Literal["ok", "partial", "error", "client_gone"]


@dataclass
class TurnOutcome:
    """How a streamed turn ended; counted in the metrics when the stream closes."""

    mode: str
    outcome: Outcome = "client_gone"

    def finished(self, result: TurnResult, metrics: ServiceMetrics) -> None:
        self.outcome = "partial" if result.partial else "ok"
        metrics.observe_turn(result, outcome=self.outcome)


async def run_turn(
    engine: Engine, tenant: str, session_id: str, message: str, *, mode: Any, images: ImageFiles,
    metrics: ServiceMetrics, user_id: str | None = None,
) -> TurnResult:
    """The whole turn; the images are deleted before this returns or raises."""
    try:
        result = await engine.turn(
            tenant, session_id, message, mode=mode, metadata=images.metadata(), user_id=user_id
        )
    except ModelError:
        metrics.count_turn(mode, "error")
        raise
    finally:
        images.cleanup()
    metrics.observe_turn(result, outcome="partial" if result.partial else "ok")
    return result


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
