"""Where a turn's time goes: every model call of the event loop, as a timeline.

`OpenAIChatModel` registers each call it makes in the running loop's `CallLog` as it asks for a
slot (`CallLog.start`) and completes the entry when the call ends: which step made it (the
reply, ``detect``, ``rewrite``, ``constraints``…, set with `model_step`), whether a turn or a
background job was waiting for it (`models.priority.call_priority`), the session of the job,
how long it waited for a slot, how long it ran, its tokens in and out and how it ended.

A turn reads the calls that overlapped it (`CallLog.between`) into its trace
(``TurnTrace.model_calls``): its own reply-path calls and any background call that held the
shared server while it ran. The log keeps the newest `CallLog.KEEP` calls of the loop.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from ..types import ModelCall
from .priority import CallPriority, call_priority

__all__ = ["CallLog", "CallMeter", "ModelCall", "call_log", "model_step", "step_session"]

_STEP: ContextVar[str | None] = ContextVar("contextmode_model_step", default=None)
_SESSION: ContextVar[str] = ContextVar("contextmode_model_session", default="")


@contextmanager
def model_step(step: str, *, session: str | None = None) -> Iterator[None]:
    """Model calls made in the block belong to ``step`` (and ``session`` when given)."""
    token = _STEP.set(step)
    session_token = _SESSION.set(session) if session is not None else None
    try:
        yield
    finally:
        _STEP.reset(token)
        if session_token is not None:
            _SESSION.reset(session_token)


def step_session() -> tuple[str | None, str]:
    """The step and session model calls made here belong to (``None``/``""`` when unset)."""
    return _STEP.get(), _SESSION.get()


@dataclass(kw_only=True)
class CallMeter:
    """A call being made: filled in by the model as it goes (`CallLog.start`)."""

    step: str
    priority: CallPriority
    session: str
    asked: float
    """Monotonic time the call asked for a slot."""
    admitted: float | None = None
    ended: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    chunks: int = 0
    outcome: str = "running"

    def admit(self) -> None:
        self.admitted = time.monotonic()

    def end(self, outcome: str) -> None:
        if self.ended is None:
            self.ended, self.outcome = time.monotonic(), outcome

    def as_call(self, origin: float) -> ModelCall:
        """The call as a trace keeps it, times from ``origin`` (a monotonic time)."""
        now = time.monotonic()
        admitted = self.admitted if self.admitted is not None else (self.ended or now)
        return ModelCall(
            step=self.step, priority=self.priority, session=self.session,
            start_ms=round((self.asked - origin) * 1000, 1),
            wait_ms=round((admitted - self.asked) * 1000, 1),
            duration_ms=round(((self.ended or now) - admitted) * 1000, 1),
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens if self.completion_tokens is not None else self.chunks or None,
            outcome=self.outcome,
        )


@dataclass
class CallLog:
    """The newest model calls of one event loop."""

    KEEP = 512
    calls: deque[CallMeter] = field(default_factory=lambda: deque(maxlen=CallLog.KEEP))

    def start(self, *, default_step: str = "reply") -> CallMeter:
        """A new call, made here (its step, priority and session from the context)."""
        step, session = step_session()
        priority = call_priority()
        meter = CallMeter(step=step or (default_step if priority == "reply" else "background"),
                          priority=priority, session=session, asked=time.monotonic())
        self.calls.append(meter)
        return meter

    def note(self, step: str, session: str, outcome: str) -> None:
        """Log work done without the model in place of a ``step`` call (the offline processors
        filling in for a model that fell behind)."""
        now = time.monotonic()
        self.calls.append(CallMeter(step=step, priority="background", session=session, asked=now,
                                    admitted=now, ended=now, outcome=outcome))

    def between(self, start: float, end: float | None = None) -> tuple[ModelCall, ...]:
        """The calls that overlapped ``[start, end]`` (monotonic times; ``end`` None: now),
        in the order they asked for a slot, times from ``start``."""
        end = time.monotonic() if end is None else end
        return tuple(
            m.as_call(start) for m in self.calls
            if m.asked <= end and (m.ended is None or m.ended >= start)
        )


_LOGS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, CallLog] = weakref.WeakKeyDictionary()


def call_log() -> CallLog:
    """The running event loop's log."""
    return _LOGS.setdefault(asyncio.get_running_loop(), CallLog())
