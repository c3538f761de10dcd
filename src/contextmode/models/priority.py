"""Replies before background jobs on a model endpoint with few parallel slots.

A llama.cpp server answers ``total_slots`` requests at once (``GET /props``), llama-cpp-python's
one; a request sent while every slot is busy waits in the server's own queue, first come first
served. A reply stuck there behind the summariser, the constraint extractor and the emotion
scorer of the previous turns is what made turns time out on a one-slot server. So the calls
queue here instead, in a `PriorityGate` per endpoint (and event loop), before anything is sent:

- a **reply** call (anything on the response path: the reply, detection, rewriting) takes a
  free slot at once, or waits for the next one behind earlier replies only;
- a **background** call (anything a background job does, marked with `in_background`) takes a
  slot only when one is free, no reply call is waiting, and one slot stays free for each turn
  being answered (on a one-slot server: no turn is being answered), and for `SETTLE_S` after
  the last one ends (the client's next message is often on its way). A background call already
  running when a reply finds no free slot is cut short (`Cuttable`: its task is cancelled, its
  stream closed, which stops the server's generation; the model raises `ModelPreempted` and the
  job tries again later), so a reply waits at most for the server to notice.
  Waiting longer than ``wait_s`` it gives up with `ModelDeferred` (a deferral, not a failed
  attempt: the job lets go and tries again later); cancelled (shutdown), it leaves the queue at
  once. Its wait does not count in the time limits around it (`waits_excluded`: the
  processor's timeout, the job attempt's): they are paused while it waits.

Which kind a call is travels in a context variable, so no signature changes: the engine wraps
each job's coroutine in `in_background`, and every model call made inside it is background.

A turn makes several reply calls one after the other (detection, rewriting, the reply) with a
free slot for a moment between them; a background call admitted there would hold up the rest
of the turn. So the engine also runs each turn inside `answering` (from preparing it to the end
of its reply): every gate of the event loop keeps one slot free for each turn being answered
that has no reply call running, which background calls may not take. An endpoint with no known slot limit gets no gate (`endpoint_gate`
returns ``None``) and nothing waits.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Iterator
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeVar

from ..errors import ModelDeferred

__all__ = [
    "CallPriority",
    "Cuttable",
    "GateState",
    "PriorityGate",
    "Replies",
    "SlotGate",
    "answering",
    "call_priority",
    "endpoint_gate",
    "in_background",
    "paused_limits",
    "response_budget",
    "response_time_left",
    "waits_excluded",
]

CallPriority = Literal["reply", "background"]
"""``reply``: someone is waiting for the answer; ``background``: a job is."""

_PRIORITY: ContextVar[CallPriority] = ContextVar("contextmode_call_priority", default="reply")

T = TypeVar("T")


def call_priority() -> CallPriority:
    """The priority of model calls made here (``reply`` unless inside `in_background`)."""
    return _PRIORITY.get()


_LIMITS: ContextVar[tuple[asyncio.Timeout, ...]] = ContextVar("contextmode_wait_excluded_limits", default=())


@contextmanager
def waits_excluded(limit: asyncio.Timeout) -> Iterator[None]:
    """``limit`` (an entered ``asyncio.timeout``) does not count the time background calls made
    in the block wait for a slot: it is paused while they wait (`paused_limits`)."""
    token = _LIMITS.set((*_LIMITS.get(), limit))
    try:
        yield
    finally:
        _LIMITS.reset(token)


@contextmanager
def paused_limits() -> Iterator[None]:
    """Pause the limits `waits_excluded` registered here for the block (a background call's wait
    for a slot), and move each one later by the time it took."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    paused: list[tuple[asyncio.Timeout, float]] = []
    for limit in _LIMITS.get():
        when = limit.when()
        if when is not None and not limit.expired():
            with suppress(RuntimeError):  # a limit no longer entered is left as it is
                limit.reschedule(None)
                paused.append((limit, when))
    try:
        yield
    finally:
        waited = loop.time() - started
        for limit, when in paused:
            with suppress(RuntimeError):
                limit.reschedule(when + waited)


_DEADLINE: ContextVar[float | None] = ContextVar("contextmode_response_deadline", default=None)


@contextmanager
def response_budget(seconds: float | None) -> Iterator[None]:
    """Reply calls made in the block (a turn's detection and rewriting) share ``seconds`` (loop
    time from now; ``None``: no shared budget). Each reads what is left with `response_time_left`."""
    deadline = None if seconds is None else asyncio.get_running_loop().time() + seconds
    token = _DEADLINE.set(deadline)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def response_time_left() -> float | None:
    """Seconds left of the `response_budget` around a reply call made here (``0`` when spent);
    ``None`` without one, or inside a background job."""
    deadline = _DEADLINE.get()
    if deadline is None or call_priority() != "reply":
        return None
    return max(0.0, deadline - asyncio.get_running_loop().time())


async def in_background(work: Awaitable[T]) -> T:
    """Await ``work`` with every model call it makes marked ``background``."""
    token = _PRIORITY.set("background")
    try:
        return await work
    finally:
        _PRIORITY.reset(token)


@dataclass(frozen=True, kw_only=True)
class GateState:
    """What a gate holds right now."""

    slots: int
    running: int
    """Calls holding a slot."""
    replies_waiting: int
    background_waiting: int


class SlotGate(Protocol):
    """Admits model calls to an endpoint's slots, replies first."""

    async def acquire(self, priority: CallPriority, *, wait_s: float | None = None) -> None:
        """Wait for a slot; a ``background`` call waiting over ``wait_s`` seconds raises `ModelDeferred`."""
        ...

    def release(self, priority: CallPriority) -> None:
        """Give back a slot taken by `acquire` with ``priority``."""
        ...

    def state(self) -> GateState: ...

    def hold(self, call: Cuttable) -> None:
        """``call``, a background call that took a slot, may be cut short for a reply."""
        ...

    def unhold(self, call: Cuttable) -> None:
        """``call`` ended: it is no longer to be cut."""
        ...


SETTLE_S = 0.5
"""After the last turn being answered ends, one slot stays kept this long (`Replies.settling`):
a client that sends its next message as soon as a reply ends finds the server free, instead of
waiting for a background call admitted in between to be cut (a server that is evaluating a
prompt notices a closed request only when it starts generating)."""


class Replies:
    """How many turns are being answered; while any is, background calls wait on every gate
    sharing this count (one per event loop, see `answering`). For ``settle_s`` seconds after the
    last one ends, one slot stays kept all the same (`settling`)."""

    def __init__(self, *, settle_s: float = SETTLE_S) -> None:
        self.active = 0
        self.settle_s = settle_s
        self._quiet_since: float | None = None
        """Loop time the last turn being answered ended (``None``: none has yet)."""
        self._gates: weakref.WeakSet[PriorityGate] = weakref.WeakSet()

    def attach(self, gate: PriorityGate) -> None:
        self._gates.add(gate)

    def settling(self) -> bool:
        """No turn is being answered, but the last one ended less than ``settle_s`` ago."""
        if self.active or self._quiet_since is None:
            return False
        return asyncio.get_running_loop().time() - self._quiet_since < self.settle_s

    def _hand_over(self) -> None:
        for gate in list(self._gates):
            gate.hand_over()

    @contextmanager
    def answering(self) -> Iterator[None]:
        """One turn being answered, for the length of the block."""
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1
            if not self.active and self.settle_s > 0:
                loop = asyncio.get_running_loop()
                self._quiet_since = loop.time()
                # the kept slot is let go then (a little after: a loop may run a timer early)
                loop.call_later(self.settle_s + 0.005, self._hand_over)
            self._hand_over()  # the slot kept for this turn is free again (for a reply at once)


PREEMPTED = "contextmode: a reply needs the slot"
"""The cancel message of a background call cut short for a reply."""


class Cuttable:
    """A background call holding a slot that a reply may cut short: `preempt` cancels its task
    (the model turns that into `ModelPreempted`, see `OpenAIChatModel`). Only while ``inside``
    (the call's body, where the task can only be suspended inside the call) is it cut."""

    def __init__(self) -> None:
        self.task = asyncio.current_task()
        self.inside = False
        self.preempted = False

    def preempt(self) -> bool:
        if not self.inside or self.preempted or self.task is None or self.task.done():
            return False
        self.preempted = True
        self.task.cancel(PREEMPTED)
        return True


class PriorityGate:
    """A `SlotGate` over ``slots`` parallel slots: replies in arrival order, then background calls.

    Plain counters and one future per waiting call, all on the running event loop (one gate
    belongs to one loop, see `endpoint_gate`). A slot is handed over to the next waiter when
    released, so a reply that arrives while background calls wait is admitted before them.
    ``replies`` counts the turns being answered (background calls wait while any is).
    """

    def __init__(self, slots: int, *, replies: Replies | None = None) -> None:
        if slots < 1:
            raise ValueError("a gate needs at least one slot")
        self.slots = slots
        self.replies = replies or Replies()
        self.replies.attach(self)
        self._running: dict[CallPriority, int] = {"reply": 0, "background": 0}
        self._waiting: dict[CallPriority, deque[asyncio.Future[None]]] = {"reply": deque(), "background": deque()}
        self._cuttable: list[Cuttable] = []
        self.preempted = 0
        """Background calls cut short for a reply so far."""

    def hold(self, call: Cuttable) -> None:
        """``call`` (a background call that took a slot) may be cut short for a reply."""
        self._cuttable.append(call)

    def unhold(self, call: Cuttable) -> None:
        with suppress(ValueError):
            self._cuttable.remove(call)

    def _preempt(self) -> None:
        """A reply found no free slot: cut the newest background call short, unless one being
        cut already frees a slot for each reply waiting."""
        cutting = sum(c.preempted for c in self._cuttable)
        if cutting >= _live(self._waiting["reply"]):
            return
        for call in reversed(self._cuttable):
            if call.preempt():
                self.preempted += 1
                return

    def state(self) -> GateState:
        return GateState(slots=self.slots, running=sum(self._running.values()),
                         replies_waiting=_live(self._waiting["reply"]),
                         background_waiting=_live(self._waiting["background"]))

    def _free(self, priority: CallPriority) -> bool:
        """A slot is free for ``priority``: for a background call, one slot stays kept for each
        turn being answered that has no reply call running (its next call is coming), and one
        while the last turn settles (`Replies.settling`: the next turn may be coming)."""
        running = sum(self._running.values())
        if priority == "reply":
            return running < self.slots
        kept = max(0, self.replies.active - self._running["reply"]) + self.replies.settling()
        return running + kept < self.slots

    def _may_enter(self, priority: CallPriority) -> bool:
        if not self._free(priority) or _live(self._waiting["reply"]):
            return False
        return priority == "reply" or not _live(self._waiting["background"])

    async def acquire(self, priority: CallPriority, *, wait_s: float | None = None) -> None:
        if self._may_enter(priority):
            self._running[priority] += 1
            return
        queue = self._waiting[priority]
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue.append(future)
        if priority == "reply":
            self._preempt()
        limit = wait_s if priority == "background" else None
        try:
            async with asyncio.timeout(limit):
                await future
        except TimeoutError:
            self._abandon(future, queue, priority)
            raise ModelDeferred(
                f"a background model call gave up after waiting {limit:g} s for a free slot "
                f"(the endpoint serves {self.slots} at a time and replies go first); tried again later"
            ) from None
        except BaseException:  # cancelled (shutdown, the job's own timeout): leave the queue
            self._abandon(future, queue, priority)
            raise

    def _abandon(
        self, future: asyncio.Future[None], queue: deque[asyncio.Future[None]], priority: CallPriority
    ) -> None:
        if future.done() and not future.cancelled():
            self.release(priority)  # the slot was handed over as the wait ended: pass it on
            return
        future.cancel()
        with suppress(ValueError):
            queue.remove(future)

    def release(self, priority: CallPriority) -> None:
        self._running[priority] -= 1
        self.hand_over()

    def hand_over(self) -> None:
        """Give free slots to the calls waiting that may have one now, replies first."""
        kinds: tuple[CallPriority, ...] = ("reply", "background")
        for priority in kinds:
            queue = self._waiting[priority]
            while queue and self._free(priority):
                future = queue.popleft()
                if not future.done():
                    future.set_result(None)
                    self._running[priority] += 1
            if _live(queue):
                return  # a reply still waiting keeps the background calls waiting too

    def __repr__(self) -> str:
        return f"PriorityGate({self.state()})"


def _live(queue: deque[asyncio.Future[None]]) -> int:
    return sum(not f.done() for f in queue)


@dataclass
class _LoopGates:
    replies: Replies = field(default_factory=Replies)
    gates: dict[tuple[str, int], PriorityGate] = field(default_factory=dict)


_LOOPS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopGates] = weakref.WeakKeyDictionary()


def _loop_gates() -> _LoopGates:
    return _LOOPS.setdefault(asyncio.get_running_loop(), _LoopGates())


def endpoint_gate(endpoint: str, slots: int | None) -> PriorityGate | None:
    """The gate every model on ``endpoint`` shares in the running loop; ``None`` when ``slots`` is
    unknown or ``0`` (no limit: nothing to order)."""
    if not slots:
        return None
    loop = _loop_gates()
    key = (endpoint.rstrip("/"), slots)
    gate = loop.gates.get(key)
    if gate is None:
        gate = loop.gates[key] = PriorityGate(slots, replies=loop.replies)
    return gate


async def answering(events: AsyncIterator[T]) -> AsyncIterator[T]:
    """Yield ``events`` (a turn's) with background calls held back on every gate of the running
    loop until they end; a generator is closed before the hold is let go."""
    with _loop_gates().replies.answering():
        try:
            async for event in events:
                yield event
        finally:
            if isinstance(events, AsyncGenerator):
                await events.aclose()
