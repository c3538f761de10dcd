"""Step 3 of a turn: store it. The user turn before the model is called, the answer after,
and the exchange's trace just after the reply (`TraceWrites`); `record` stores a turn the
application already has."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from ..errors import ConflictError, SessionErased
from ..models.calls import ModelCall
from ..models.offline import OfflineResponder
from ..store.base import TraceRecords
from ..store.postings import has_postings
from ..store.records import cap_trace, exchange_count
from ..types import NewTurn, SessionKey, SessionState, Turn, check_storable, utc_now
from .privacy import keepable_trace, masked_counts
from .request import PreparedTurn, TurnRequest
from .seams import indexes_turns
from .trace import ExchangeOutcome, build_trace

if TYPE_CHECKING:
    from .core import Engine

__all__ = [
    "Answer",
    "TraceWrites",
    "append_fenced",
    "exchanges_so_far",
    "observe",
    "record_turn",
    "store_answer",
    "store_user_turn",
]

log = logging.getLogger("contextmode.turn")


async def store_user_turn(engine: Engine, request: TurnRequest, prepared: PreparedTurn) -> Turn:
    """Store the user's message, numbered by exchange, with what preparing decided about it
    (a retry of a failed request reuses its stored turn: `PreparedTurn.retried`)."""
    if prepared.retried is not None:
        return prepared.retried
    key = request.key
    meta = request.turn_metadata()
    meta["turn"] = await exchanges_so_far(engine, key, prepared.state) + 1
    if prepared.rewrite is not None and prepared.rewrite.changed:
        meta["rewrite"] = prepared.rewrite.text
        meta["rewrite_verified"] = prepared.rewrite.verified
    if prepared.rejected_rewrite is not None:
        meta["rewrite_rejected"] = {
            "text": prepared.rejected_rewrite.text,
            "reason": prepared.rejected_rewrite.reason,
            "source": prepared.rejected_rewrite.source,
        }
    if prepared.detection.intent:
        meta["intent"] = prepared.detection.intent
    new = NewTurn(role="user", content=request.message, tokens=engine.counter.count(request.message), metadata=meta)
    turn = (await append_fenced(engine, key, engine.keepable(key.tenant, [new]), holds=prepared.state.last_seq,
                                user_id=request.user_id))[0]
    observe(engine, key, [turn])
    return turn


_FENCE_TRIES = 8


async def append_fenced(
    engine: Engine, key: SessionKey, turns: Sequence[NewTurn], *, holds: int, user_id: str | None = None
) -> list[Turn]:
    """Append ``turns`` to a session that must still hold turn ``holds`` (what the turn loaded or
    stored before), or raise `SessionErased`: a forget, delete or retention that erased the session
    while the turn ran is never undone by the turn's own writes (appending would re-create it).

    The append is a compare-and-set at the head seen; a head below ``holds`` means the session
    was erased. ``holds`` 0 (a new session) appends unconditionally.
    """
    store = engine.store
    if holds <= 0:
        return await store.append(key.tenant, key.session_id, turns, user_id=user_id)
    head = holds
    for _ in range(_FENCE_TRIES):
        try:
            return await store.append(key.tenant, key.session_id, turns, expected_last_seq=head, user_id=user_id)
        except ConflictError:
            head = (await store.version(key.tenant, key.session_id)).last_seq
            if head < holds:
                raise SessionErased(
                    f"session {key.session_id!r} was erased during this turn; nothing of the turn was stored"
                ) from None
    raise ConflictError(f"session {key.session_id!r} kept changing underneath; the turn was not stored")


@dataclass(frozen=True, kw_only=True, slots=True)
class Answer:
    """How the model's answer ended, as `store_answer` needs it."""

    text: str
    partial: bool
    """The stream broke (or the client went away) before the end."""
    ttft_ms: float | None
    model_ms: float
    model_calls: tuple[ModelCall, ...] = ()
    """The model calls made while the turn ran (for its trace)."""
    stopped: str | None = None
    """Why the engine stopped the reply early (it degenerated): stored with the answer."""


async def store_answer(
    engine: Engine, key: SessionKey, user_turn: Turn, answer: Answer, prepared: PreparedTurn
) -> Turn | None:
    """Store the answer (unless nothing arrived), then start writing the exchange's trace.

    The trace is written just after the reply (`TraceWrites`): the reply never waits for it.
    """
    stored: Turn | None = None
    if answer.text or not answer.partial:  # nothing arrived: the user turn stays, no empty answer is stored
        meta: dict[str, Any] = {"reply_to": user_turn.seq, "model": engine.model.name}
        if "turn" in user_turn.metadata:
            meta["turn"] = user_turn.metadata["turn"]
        if answer.partial:
            meta["partial"] = True
        if answer.stopped:
            meta["stopped"] = answer.stopped
        if isinstance(engine.model, OfflineResponder):
            # A description of the request, not an answer: an engine notice, never memory.
            meta["offline"] = True
            meta["notice"] = True
        new = NewTurn(role="assistant", content=answer.text, tokens=engine.counter.count(answer.text), metadata=meta)
        appended = await append_fenced(engine, key, engine.keepable(key.tenant, [new]), holds=user_turn.seq)
        observe(engine, key, appended)
        stored = appended[0]
    elif (await engine.store.version(key.tenant, key.session_id)).last_seq < user_turn.seq:
        raise SessionErased(f"session {key.session_id!r} was erased during this turn")
    number = user_turn.metadata.get("turn")
    keeper = engine.trace_keeper()
    if isinstance(number, int) and keeper is not None:
        outcome = ExchangeOutcome(
            turn=number, user_seq=user_turn.seq, answer_seq=stored.seq if stored else None,
            ttft_ms=answer.ttft_ms, model_ms=answer.model_ms, partial=answer.partial,
            model_calls=answer.model_calls, stopped=answer.stopped,
        )
        masked = masked_counts(user_turn, stored)
        stored_turns = (user_turn, stored) if stored is not None else (user_turn,)
        engine.trace_writes.add(key, _keep_trace(engine, keeper, key, prepared, outcome, masked, stored_turns))
    return stored


async def _keep_trace(
    engine: Engine, keeper: TraceRecords, key: SessionKey, prepared: PreparedTurn, outcome: ExchangeOutcome,
    masked: Mapping[str, int], stored: tuple[Turn, ...],
) -> None:
    settings = engine.settings
    try:
        trace = build_trace(prepared, outcome, processors=engine.processor_versions(), model=engine.model.name,
                            stored=stored)
        trace = keepable_trace(settings.pii_for(key.tenant), replace(trace, pii_masked=masked) if masked else trace)
        max_age = settings.trace_max_age_days
        async with engine.one_connection():  # the check and the write: one pooled connection
            if (await engine.store.version(key.tenant, key.session_id)).last_seq < outcome.user_seq:
                return  # erased since the reply (a forget on another worker): keep nothing of it
            await keeper.put_trace(
                key.tenant, key.session_id, cap_trace(trace, settings.trace_max_bytes),
                keep=settings.trace_keep,
                older_than=trace.created_at - timedelta(days=max_age) if max_age else None,
            )
    except Exception:
        # The turn and its answer are stored; a lost trace must not fail anything.
        log.warning("trace of turn %d (session %s) not kept", outcome.turn, key.session_id, exc_info=True)


class TraceWrites:
    """The exchanges' trace writes, run just after the reply: one ordered chain per session.

    `add` starts a write after the session's previous one, at once, or when the `held`
    block around the turn ends (the service holds them until its reply is out, so a
    trace write never queues before the reply's own store calls); `settle` starts the
    session's held writes and waits for them (a reader of its traces, or an erasure,
    comes next); `drain` does so for every session (tests, shutdown). A write that fails
    is logged and dropped: the turn is stored either way.
    """

    def __init__(self) -> None:
        self._tails: dict[tuple[str, str], asyncio.Task[None]] = {}
        """Each session's newest write; it finishes after every earlier one of the session."""
        self._held: dict[tuple[str, str], tuple[asyncio.Event, int]] = {}
        """Sessions whose new writes wait: the event that starts them, and how many hold it."""

    def add(self, key: SessionKey, write: Coroutine[Any, Any, None]) -> None:
        """Run ``write`` after the session's pending writes (needs a running event loop)."""
        name = (key.tenant, key.session_id)
        held = self._held.get(name)
        task = asyncio.get_running_loop().create_task(
            _after(held[0] if held else None, self._tails.get(name), write),
            name=f"contextmode-trace:{key.tenant}/{key.session_id}",
        )
        self._tails[name] = task
        task.add_done_callback(lambda done: self._forget(name, done))

    def _forget(self, name: tuple[str, str], done: asyncio.Task[None]) -> None:
        if self._tails.get(name) is done:
            del self._tails[name]

    @contextmanager
    def held(self, tenant: str, session_id: str) -> Iterator[None]:
        """The session's writes added inside the block start when it ends (or when `settle`
        or `drain` asks for them first)."""
        name = (tenant, session_id)
        event, holders = self._held.get(name, (None, 0))
        event = event or asyncio.Event()
        self._held[name] = (event, holders + 1)
        try:
            yield
        finally:
            current = self._held.get(name)
            if current is not None and current[0] is event:  # else a reader already started them
                if current[1] <= 1:
                    del self._held[name]
                    event.set()
                else:
                    self._held[name] = (event, current[1] - 1)

    def _release(self, name: tuple[str, str]) -> None:
        held = self._held.pop(name, None)
        if held is not None:
            held[0].set()

    def pending(self, tenant: str, session_id: str) -> bool:
        """True while a trace of the session is still to be written."""
        return (tenant, session_id) in self._tails

    async def settle(self, tenant: str, session_id: str) -> None:
        """Wait until the session's pending trace writes are done, held ones included (a
        cancelled caller stops waiting; the writes go on)."""
        name = (tenant, session_id)
        self._release(name)
        tail = self._tails.get(name)
        if tail is not None and not tail.done():
            await asyncio.wait([tail])

    async def drain(self) -> None:
        """Wait until every pending trace write is done, held ones included."""
        while self._tails:
            for name in list(self._held):
                self._release(name)
            await asyncio.wait(list(self._tails.values()))

    async def aclose(self) -> None:
        """Cancel the pending writes (shutdown that could not wait for them)."""
        tasks = list(self._tails.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tails.clear()


async def _after(
    hold: asyncio.Event | None, previous: asyncio.Task[None] | None, write: Coroutine[Any, Any, None]
) -> None:
    """``write``, once ``hold`` is set and ``previous`` is done: a session's traces are
    written in turn order."""
    try:
        if hold is not None and not hold.is_set():
            await hold.wait()
        if previous is not None and not previous.done():
            await asyncio.wait([previous])
    except BaseException:  # cancelled while waiting (shutdown): the write never starts
        write.close()
        raise
    await write


async def exchanges_so_far(engine: Engine, key: SessionKey, state: SessionState | None) -> int:
    """How many user messages the session holds (the newest's exchange number).

    Read from the newest user turn's stamp: O(1) from the loaded tail. Only a
    session whose newest user turn predates the numbering counts them all, once.
    """
    store = engine.store
    if state is not None:
        if state.last_seq == 0:
            return 0
        known = exchange_count(state.turns)
        if known is not None:
            return known
    last_seq = state.last_seq if state is not None else (await store.version(key.tenant, key.session_id)).last_seq
    if last_seq == 0:
        return 0
    tail = await store.turns(key.tenant, key.session_id, from_seq=max(1, last_seq - 3))
    known = exchange_count(tail)
    if known is not None:
        return known
    history = await store.turns(key.tenant, key.session_id)
    return sum(1 for t in history if t.role == "user")


async def record_turn(
    engine: Engine, key: SessionKey, role: Literal["user", "assistant"], content: str,
    *, metadata: dict[str, Any] | None, created_at: datetime | None, user_id: str | None,
) -> Turn:
    """Append one turn without calling the model, numbered by exchange like a live one.

    Text no store can keep (NUL, a lone surrogate) is refused with `InputError` first."""
    check_storable(content, "content")
    check_storable(metadata, "metadata")
    meta = dict(metadata or {})
    meta["turn"] = await exchanges_so_far(engine, key, None) + (role == "user")
    new = NewTurn(
        role=role, content=content, tokens=engine.counter.count(content), metadata=meta,
        created_at=created_at or utc_now(),
    )
    turn = (await engine.store.append(key.tenant, key.session_id, engine.keepable(key.tenant, [new]), user_id=user_id))[0]
    observe(engine, key, [turn])
    return turn


def observe(engine: Engine, key: SessionKey, turns: Sequence[Turn]) -> None:
    """Keep the recall index current: O(new turns), never a re-index."""
    # A store that keeps the recall index wrote it with the turns: nothing to do here.
    recaller = engine.recaller
    if recaller is not None and indexes_turns(recaller) and not has_postings(engine.store):
        recaller.observe(key.tenant, key.session_id, turns)
