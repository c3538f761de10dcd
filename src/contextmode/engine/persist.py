"""Step 3 of a turn: store it. The user turn before the model is called, the answer after,
and the exchange's trace just after the reply (`TraceWrites`); `record` stores a turn the
application already has."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from ..errors import ConflictError, SessionErased
from ..models.base import answers_with_notices
from ..models.caching import ModelUsage, request_text
from ..models.calls import ModelCall
from ..store.base import TraceRecords
from ..store.postings import has_postings
from ..store.records import cap_trace, exchange_count
from ..types import NewTurn, SessionKey, SessionState, Turn, check_storable, utc_now
from .parts import TurnParts
from .privacy import keepable_trace, masked_counts
from .request import PreparedTurn, TurnRequest
from .seams import indexes_turns
from .trace import ExchangeOutcome, build_trace
from .usage import UsageBasis, turn_usage

__all__ = [
    "Answer",
    "append_fenced",
    "exchanges_so_far",
    "observe",
    "record_turn",
    "store_answer",
    "store_user_turn",
]

log = logging.getLogger("contextmode.turn")


async def store_user_turn(parts: TurnParts, request: TurnRequest, prepared: PreparedTurn) -> Turn:
    """Store the user's message, numbered by exchange, with what preparing decided about it
    (a retry of a failed request reuses its stored turn: `PreparedTurn.retried`)."""
    if prepared.retried is not None:
        return prepared.retried
    key = request.key
    meta = request.turn_metadata()
    meta["turn"] = await exchanges_so_far(parts, key, prepared.state) + 1
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
    message = request.text()
    new = NewTurn(role="user", content=message, tokens=parts.counter.count(message), metadata=meta)
    turn = (await append_fenced(parts, key, parts.keepable(key.tenant, [new]), holds=prepared.state.last_seq,
                                user_id=request.user_id))[0]
    observe(parts, key, [turn])
    return turn


_FENCE_TRIES = 8


async def append_fenced(
    parts: TurnParts, key: SessionKey, turns: Sequence[NewTurn], *, holds: int, user_id: str | None = None
) -> list[Turn]:
    """Append ``turns`` to a session that must still hold turn ``holds`` (what the turn loaded or
    stored before), or raise `SessionErased`: a forget, delete or retention that erased the session
    while the turn ran is never undone by the turn's own writes (appending would re-create it).

    The append is a compare-and-set at the head seen; a head below ``holds`` means the session
    was erased. ``holds`` 0 (a new session) appends unconditionally.
    """
    store = parts.store
    if holds <= 0:
        return await store.append(key, turns, user_id=user_id)
    head = holds
    for _ in range(_FENCE_TRIES):
        try:
            return await store.append(key, turns, expected_last_seq=head, user_id=user_id)
        except ConflictError:
            head = (await store.version(key)).last_seq
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
    usage: ModelUsage | None = None
    """What the endpoint reported for the call (tokens, cached tokens), if it did."""
    model_calls: tuple[ModelCall, ...] = ()
    """The model calls made while the turn ran (for its trace)."""
    stopped: str | None = None
    """Why the engine stopped the reply early (it degenerated): stored with the answer."""


async def store_answer(
    parts: TurnParts, key: SessionKey, user_turn: Turn, answer: Answer, prepared: PreparedTurn
) -> Turn | None:
    """Store the answer (unless nothing arrived), then start writing the exchange's trace.

    The trace is written just after the reply (`TraceWrites`): the reply never waits for it.
    """
    stored: Turn | None = None
    if answer.text or not answer.partial:  # nothing arrived: the user turn stays, no empty answer is stored
        meta: dict[str, Any] = {"reply_to": user_turn.seq, "model": parts.model.name}
        if "turn" in user_turn.metadata:
            meta["turn"] = user_turn.metadata["turn"]
        if answer.partial:
            meta["partial"] = True
        if answer.stopped:
            meta["stopped"] = answer.stopped
        if answers_with_notices(parts.model):
            # A description of the request, not an answer: an engine notice, never memory.
            meta["offline"] = True
            meta["notice"] = True
        new = NewTurn(role="assistant", content=answer.text, tokens=parts.counter.count(answer.text), metadata=meta)
        appended = await append_fenced(parts, key, parts.keepable(key.tenant, [new]), holds=user_turn.seq)
        observe(parts, key, appended)
        stored = appended[0]
    elif (await parts.store.version(key)).last_seq < user_turn.seq:
        raise SessionErased(f"session {key.session_id!r} was erased during this turn")
    number = user_turn.metadata.get("turn")
    keeper = parts.trace_keeper
    if isinstance(number, int) and keeper is not None:
        outcome = ExchangeOutcome(
            turn=number, user_seq=user_turn.seq, answer_seq=stored.seq if stored else None,
            ttft_ms=answer.ttft_ms, model_ms=answer.model_ms, partial=answer.partial,
            reported_prompt_tokens=answer.usage.prompt_tokens if answer.usage else None,
            reported_cached_tokens=answer.usage.cached_tokens if answer.usage else None,
            completion_tokens=answer.usage.completion_tokens if answer.usage else None,
            model_calls=answer.model_calls, stopped=answer.stopped,
        )
        masked = masked_counts(user_turn, stored)
        stored_turns = (user_turn, stored) if stored is not None else (user_turn,)
        parts.trace_writes.add(key, _keep_trace(parts, keeper, key, prepared, outcome, masked, stored_turns))
    return stored


async def _keep_trace(
    parts: TurnParts, keeper: TraceRecords, key: SessionKey, prepared: PreparedTurn, outcome: ExchangeOutcome,
    masked: Mapping[str, int], stored: tuple[Turn, ...],
) -> None:
    settings = parts.settings
    try:
        trace = build_trace(prepared, outcome, processors=parts.processor_versions(), model=parts.model.name,
                            stored=stored)
        trace = keepable_trace(settings.pii_for(key.tenant), replace(trace, pii_masked=masked) if masked else trace)
        max_age = settings.trace_max_age_days
        async with parts.one_connection():  # the check and the write: one pooled connection
            version = await parts.store.version(key)
            if version.last_seq < outcome.user_seq:
                return  # erased since the reply (a forget on another worker): keep nothing of it
            previous = await _previous_basis(parts, keeper, key, outcome, version.created_at)
            # The request as sent, rendered once: for this exchange's usage and the next one's basis.
            request = None if trace.cut else request_text(trace.messages)
            trace = replace(trace, usage=turn_usage(trace, outcome, previous, counter=parts.counter,
                                                    prices=settings.prices, request=request))
            kept = cap_trace(trace, settings.trace_max_bytes)
            await keeper.put_trace(
                key, kept, keep=settings.trace_keep,
                older_than=trace.created_at - timedelta(days=max_age) if max_age else None,
            )
        if outcome.answer_seq is not None:
            parts.kept_requests.keep(key, keeper, kept, last_seq=outcome.answer_seq,
                                     session_created=version.created_at, request=request)
    except Exception:
        # The turn and its answer are stored; a lost trace must not fail anything.
        log.warning("trace of turn %d (session %s) not kept", outcome.turn, key.session_id, exc_info=True)


async def _previous_basis(
    parts: TurnParts, keeper: TraceRecords, key: SessionKey, outcome: ExchangeOutcome, created: datetime | None
) -> UsageBasis | None:
    """What the previous exchange's kept trace gives this one's usage: remembered by this
    process (`KeptRequests`), else read from the store (``None``: not kept)."""
    if outcome.turn <= 1:
        return None
    remembered = parts.kept_requests.basis(key, keeper, turn=outcome.turn, user_seq=outcome.user_seq,
                                           session_created=created)
    if remembered is not None:
        return remembered
    previous = await keeper.get_trace(key, outcome.turn - 1)
    return UsageBasis.of(previous) if previous is not None else None


async def exchanges_so_far(parts: TurnParts, key: SessionKey, state: SessionState | None) -> int:
    """How many user messages the session holds (the newest's exchange number).

    Read from the newest user turn's stamp: O(1) from the loaded tail. Only a
    session whose newest user turn predates the numbering counts them all, once.
    """
    store = parts.store
    if state is not None:
        if state.last_seq == 0:
            return 0
        known = exchange_count(state.turns)
        if known is not None:
            return known
    last_seq = state.last_seq if state is not None else (await store.version(key)).last_seq
    if last_seq == 0:
        return 0
    tail = await store.turns(key, from_seq=max(1, last_seq - 3))
    known = exchange_count(tail)
    if known is not None:
        return known
    history = await store.turns(key)
    return sum(1 for t in history if t.role == "user")


async def record_turn(
    parts: TurnParts, key: SessionKey, role: Literal["user", "assistant"], content: str,
    *, metadata: dict[str, Any] | None, created_at: datetime | None, user_id: str | None,
) -> Turn:
    """Append one turn without calling the model, numbered by exchange like a live one.

    Text no store can keep (NUL, a lone surrogate) is refused with `InputError` first."""
    check_storable(content, "content")
    check_storable(metadata, "metadata")
    meta = dict(metadata or {})
    meta["turn"] = await exchanges_so_far(parts, key, None) + (role == "user")
    new = NewTurn(
        role=role, content=content, tokens=parts.counter.count(content), metadata=meta,
        created_at=created_at or utc_now(),
    )
    turn = (await parts.store.append(key, parts.keepable(key.tenant, [new]), user_id=user_id))[0]
    observe(parts, key, [turn])
    return turn


def observe(parts: TurnParts, key: SessionKey, turns: Sequence[Turn]) -> None:
    """Keep the recall index current: O(new turns), never a re-index."""
    # A store that keeps the recall index wrote it with the turns: nothing to do here.
    recaller = parts.recaller
    if recaller is not None and indexes_turns(recaller) and not has_postings(parts.store):
        recaller.observe(key.tenant, key.session_id, turns)
