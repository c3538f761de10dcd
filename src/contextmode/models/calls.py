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
import math
import statistics
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from ..tokens.estimate import EstimateCounter
from ..tokens.tools import count_messages
from ..types import ChatMessage, ModelCall
from .priority import CallPriority, call_priority

__all__ = ["PROMPT_ESTIMATE", "CallLog", "CallMeter", "ModelCall", "call_log", "estimate_prompt", "model_step", "step_session"]

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
    first_chunk: float | None = None
    """Monotonic time its first streamed chunk came (the server had read the prompt)."""
    last_chunk: float | None = None
    """Monotonic time its latest streamed chunk came."""
    prompt_size: int | None = None
    """Its prompt's tokens as `estimate_prompt` counts them (servers report none while streaming:
    llama-cpp-python), the measure `CallLog.prompt_rate` reads."""
    outcome: str = "running"
    log: CallLog | None = field(default=None, repr=False, compare=False)
    """The log it was started in (told when it ends)."""
    number: int = field(default=0, repr=False, compare=False)
    """Its place in the log: the log's n-th call."""

    def admit(self) -> None:
        self.admitted = time.monotonic()

    def end(self, outcome: str) -> None:
        if self.ended is None:
            self.ended, self.outcome = time.monotonic(), outcome
            if self.log is not None:
                self.log.ended(self)

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
    """The newest model calls of one event loop.

    Besides the calls in order, it keeps the calls still running and the order calls ended
    in, so `between` looks only at the calls that asked since ``start`` and at those that
    were running then, not at every kept call."""

    KEEP = 512
    calls: deque[CallMeter] = field(default_factory=lambda: deque(maxlen=CallLog.KEEP))
    _made: int = 0
    """Calls ever logged (the newest one's `CallMeter.number`)."""
    _running: dict[int, CallMeter] = field(default_factory=dict)
    """Calls not ended yet, by number."""
    _ends: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=CallLog.KEEP))
    """(when, number) of the newest calls that ended, in the order they ended."""

    def _add(self, meter: CallMeter) -> CallMeter:
        self._made += 1
        meter.number, meter.log = self._made, self
        self.calls.append(meter)
        if meter.ended is None:
            self._running[meter.number] = meter
            if len(self._running) > self.KEEP:
                self._forget_dropped()
        else:
            self._ends.append((meter.ended, meter.number))
        return meter

    def _forget_dropped(self) -> int:
        """Forget the running calls that fell out of the log without ending; the number of
        the oldest call kept."""
        oldest_kept = self._made - len(self.calls) + 1
        for number in [n for n in self._running if n < oldest_kept]:
            del self._running[number]
        return oldest_kept

    def ended(self, meter: CallMeter) -> None:
        """`CallMeter.end` says its call ended."""
        if self._running.pop(meter.number, None) is not None and meter.ended is not None:
            self._ends.append((meter.ended, meter.number))

    def start(self, *, default_step: str = "reply") -> CallMeter:
        """A new call, made here (its step, priority and session from the context)."""
        step, session = step_session()
        priority = call_priority()
        return self._add(CallMeter(step=step or (default_step if priority == "reply" else "background"),
                                   priority=priority, session=session, asked=time.monotonic()))

    def note(self, step: str, session: str, outcome: str, *, priority: CallPriority = "background") -> None:
        """Log work done without the model in place of a ``step`` call (the offline processors
        filling in for a model that fell behind, or for a turn whose response path ran out of time)."""
        now = time.monotonic()
        self._add(CallMeter(step=step, priority=priority, session=session, asked=now,
                            admitted=now, ended=now, outcome=outcome))

    RATE_CALLS = 16
    """Newest calls `prompt_rate` reads."""

    def prompt_rate(self) -> float | None:
        """Prompt tokens (as `estimate_prompt` counts them) per second the loop's model server
        reads: the median over the newest `RATE_CALLS` streamed calls with a prompt of 64 or
        more, of its tokens over the time from the call's slot to its first chunk (a wait in the
        server's own queue counts, so the figure errs slow). ``None`` before any such call."""
        def rate(meter: CallMeter) -> float | None:
            tokens, admitted, first = meter.prompt_size, meter.admitted, meter.first_chunk
            if tokens is None or tokens < 64 or admitted is None or first is None or first <= admitted:
                return None
            return tokens / (first - admitted)

        return self._median_rate(rate)

    def output_rate(self) -> float | None:
        """Tokens per second the loop's model server writes: the median over the newest
        `RATE_CALLS` streamed calls with 8 or more tokens out (the server's count when it
        reported one, else the chunks it sent: llama-cpp-python reports none while streaming and
        sends a chunk per token, or one per character that takes several, so the figure errs
        slow), of those tokens over the time from the first chunk to the last. A silence after
        the last chunk (a stream cut at its deadline while the server made tokens it could not
        send) is not writing time: counted, one such call would size every later call to a few
        tokens, and calls that short would never measure the rate again. ``None`` before any
        such call."""
        def rate(meter: CallMeter) -> float | None:
            tokens = meter.completion_tokens if meter.completion_tokens is not None else meter.chunks
            first, last = meter.first_chunk, meter.last_chunk
            if tokens < 8 or first is None or last is None or last <= first:
                return None
            return tokens / (last - first)

        return self._median_rate(rate)

    def _median_rate(self, rate: Callable[[CallMeter], float | None]) -> float | None:
        """The median of ``rate`` over the newest `RATE_CALLS` calls it measures (``None`` for
        a call it cannot); ``None`` when it measures none."""
        rates: list[float] = []
        for meter in reversed(self.calls):
            if (measured := rate(meter)) is not None:
                rates.append(measured)
                if len(rates) == self.RATE_CALLS:
                    break
        return statistics.median(rates) if rates else None

    def output_in_time(self, seconds: float, prompt_size: int | None) -> int | None:
        """The tokens the server can write in ``seconds`` after reading a prompt of
        ``prompt_size`` (`estimate_prompt` tokens), at `OUTPUT_SHARE` of its measured rates
        (`output_rate`, `prompt_rate`); ``None`` while it has not been measured. At least
        `MIN_OUTPUT`: a call that late is cut at its deadline anyway."""
        rate = self.output_rate()
        if rate is None:
            return None
        reading = self.prompt_rate()
        left = seconds - (prompt_size / reading if prompt_size and reading else 0.0)
        return max(MIN_OUTPUT, math.floor(rate * left * OUTPUT_SHARE))

    def between(self, start: float, end: float | None = None) -> tuple[ModelCall, ...]:
        """The calls that overlapped ``[start, end]`` (monotonic times; ``end`` None: now),
        in the order they asked for a slot, times from ``start``."""
        end = time.monotonic() if end is None else end
        return tuple(m.as_call(start) for m in self._overlapping(start, end))

    def _overlapping(self, start: float, end: float) -> list[CallMeter]:
        # Calls are kept in the order they asked (`asked` never decreases along `calls`): those
        # that asked since ``start`` are the newest ones; an older one overlaps only if it was
        # still running at ``start``: it runs now, or it ended since.
        newest: list[CallMeter] = []
        for meter in reversed(self.calls):
            if meter.asked < start:
                break
            if meter.asked <= end:
                newest.append(meter)
        newest.reverse()
        oldest_kept = self._forget_dropped()
        if self._ends and len(self._ends) == self._ends.maxlen and self._ends[0][0] >= start:
            # More calls ended since ``start`` than are remembered: look at every kept call.
            return [m for m in self.calls if m.asked <= end and (m.ended is None or m.ended >= start)]
        older = set(self._running)
        for when, number in reversed(self._ends):
            if when < start:
                break
            older.add(number)
        before = [self.calls[n - oldest_kept] for n in sorted(older) if n >= oldest_kept]
        return [m for m in before if m.asked < start and m.asked <= end] + newest


OUTPUT_SHARE = 0.8
"""Of the time a call has left when it is sent, the share its answer is sized to fill at the
server's measured rates (`CallLog.output_in_time`); the rest absorbs a slower stretch."""

MIN_OUTPUT = 16
"""The fewest tokens `CallLog.output_in_time` allows a call."""


_LOGS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, CallLog] = weakref.WeakKeyDictionary()


PROMPT_ESTIMATE = EstimateCounter(quiet=True)
"""One measure of prompts for every model (the generic estimate): what `CallMeter.prompt_size`
holds, and what a response-path call is fitted with (`processors.llm`)."""


def estimate_prompt(messages: Sequence[Mapping[str, object]]) -> int:
    """A request's messages (as sent: ``role`` and ``content``) in `PROMPT_ESTIMATE` tokens, as
    `count_messages` counts them (a content that is not text counts nothing)."""
    return count_messages(PROMPT_ESTIMATE, [
        ChatMessage(role=str(m.get("role") or "user"), content=content)  # type: ignore[arg-type]
        for m in messages if isinstance(content := m.get("content"), str)
    ])


def call_log() -> CallLog:
    """The running event loop's log."""
    return _LOGS.setdefault(asyncio.get_running_loop(), CallLog())
