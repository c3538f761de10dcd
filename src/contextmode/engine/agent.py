"""An agent turn: the engine's turn when the model may call tools.

The client's agent loop works unchanged: it sends a user message, the model
answers with tool calls, the client runs them and sends their results as its
new messages, and the model continues. Every item goes into the append-only
log (a call as its assistant turn's ``tool_calls``, a result as a ``tool``
turn); the context is assembled from the log with the latest user turn and the
current step (the calls and results after it) always present (docs/agents.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from ..assembly import CurrentTurn, assemble, to_messages
from ..assembly.agent import split_step
from ..errors import InputError, ModelError
from ..memory.strategies import get_strategy
from ..models.base import (
    ModelEvent,
    Relay,
    TextDelta,
    ToolChoice,
    ToolSpec,
    UpstreamReply,
    calls_tools,
    relays,
)
from ..models.caching import cache_session
from ..processors.base import Detection
from ..settings import Mode
from ..tokens.tools import count_turn
from ..types import NewTurn, SessionKey, SessionState, ToolCall, Turn
from .parts import TurnParts
from .persist import append_fenced, observe
from .prepare import load_state, prepare_turn
from .request import (
    USE_DEFAULT,
    Delta,
    Done,
    Failed,
    Prepared,
    PreparedTurn,
    ToolCallPart,
    ToolResult,
    TurnEvent,
    TurnRequest,
    TurnResult,
    Upstream,
    UseDefault,
)
from .schedule import schedule_jobs
from .stream import Ending, reply_cap, window_left

__all__ = ["AgentRequest", "ToolResult", "latest_user", "prepare_step", "stream_agent_turn"]


@dataclass(frozen=True, kw_only=True)
class AgentRequest:
    """One step of an agent loop: a new user message, or the results of the last calls; a
    convenience for the agent fields of a `TurnRequest` (`request`)."""

    message: str | None = None
    """A new user message (``None`` when the client only sends tool results)."""
    tool_results: Sequence[ToolResult] = ()
    """Results of the model's last tool calls, in the client's order."""
    tools: Sequence[ToolSpec] = ()
    """The tools offered to the model (OpenAI's shape, passed through)."""
    tool_choice: ToolChoice | None = None
    relay: Relay | None = None
    """The client's own request fields (its ``tools`` among them), sent to a model that relays
    them (the memory proxy; see `TurnRequest.relay`)."""
    retry_window_s: float = 0.0
    """A user message repeating the session's last, unanswered one within this many seconds
    reuses its stored turn (`TurnRequest.retry_window_s`)."""

    def __post_init__(self) -> None:
        if self.message is None and not self.tool_results:
            raise InputError("an agent step needs a user message or tool results")

    def request(
        self, key: SessionKey, *, mode: Mode | None = None, metadata: Mapping[str, Any] | None = None,
        system_prompt: str | UseDefault | None = USE_DEFAULT,
    ) -> TurnRequest:
        """This step as the session's `TurnRequest` (what `Engine.stream_agent` runs)."""
        return TurnRequest(
            key=key, message=self.message, tool_results=self.tool_results, tools=self.tools,
            tool_choice=self.tool_choice, relay=self.relay, retry_window_s=self.retry_window_s, mode=mode,
            metadata=metadata or {}, system_prompt=system_prompt,
        )


def _answered_and_named(turns: Sequence[Turn]) -> tuple[set[str], dict[str, str]]:
    answered = {t.tool_call_id for t in turns if t.role == "tool" and t.tool_call_id}
    names = {c.id: c.name for t in turns for c in t.tool_calls}
    return answered, names


async def _store_results(parts: TurnParts, key: SessionKey, results: Sequence[ToolResult]) -> list[Turn]:
    """Append the results not stored yet (a client resending its history stores nothing twice)."""
    tenant = key.tenant
    state = await parts.store.load(key, recent=64, max_uncovered=64)
    answered, names = _answered_and_named(state.turns)
    fresh = [r for r in results if r.call_id not in answered]
    if not fresh:
        return []
    new = [
        NewTurn(
            role="tool",
            content=r.content,
            tokens=count_turn(parts.counter, r.content, tool_result=True),
            tool_call_id=r.call_id,
            tool_name=names.get(r.call_id),
        )
        for r in fresh
    ]
    stored = await parts.store.append(key, parts.keepable(tenant, new))
    observe(parts, key, stored)
    return stored


async def latest_user(parts: TurnParts, key: SessionKey, state: SessionState) -> tuple[list[Turn], Turn, list[Turn]]:
    history, user, step = split_step(state.turns)
    if user is not None:
        return history, user, step
    # A long step pushed the user turn out of the loaded window: look further back.
    end = state.turns[0].seq - 1 if state.turns else state.last_seq
    while end >= 1:
        older = await parts.store.turns(key, from_seq=max(1, end - 199), to_seq=end)
        _, found, rest = split_step(older)
        if found is not None:
            return [], found, [*rest, *state.turns]
        end -= 200
    raise InputError("tool results need a user message before them in this session")


async def prepare_step(
    parts: TurnParts, key: SessionKey, *, mode: Mode, system_prompt: str | UseDefault | None,
    now: datetime | None = None,
) -> PreparedTurn:
    """The context for continuing an agent step: the latest user turn, then its calls and results."""
    started = time.perf_counter()
    chosen = get_strategy(parts.settings.strategy)
    state = await load_state(parts, key, chosen)
    history, user, step = await latest_user(parts, key, state)
    context = assemble(
        replace(state, turns=tuple(history)), user.content, counter=parts.counter, strategy=chosen,
        budget=parts.budget(), config=parts.assembly_config(system_prompt), now=now, current=CurrentTurn(agent_step=step),
    )
    return PreparedTurn(
        state=state, detection=Detection(needs_context=False), rewrite=None, context=context,
        messages=to_messages(context), mode=mode, prepare_ms=(time.perf_counter() - started) * 1000,
    )


@dataclass
class _Answer:
    """The model's answer as it streams: text and the calls assembled from their deltas."""

    pieces: list[str]
    calls: dict[int, dict[str, str]]

    def add(self, event: ModelEvent) -> None:
        match event.kind:
            case "text":
                self.pieces.append(event.text)
            case "tool_call":
                call = self.calls.setdefault(event.index, {"id": "", "name": "", "arguments": ""})
                call["id"] = event.id or call["id"]
                call["name"] = event.name or call["name"]
                call["arguments"] += event.arguments

    def tool_calls(self) -> tuple[ToolCall, ...]:
        return tuple(
            ToolCall(id=c["id"] or f"call_{i}", name=c["name"], arguments=c["arguments"] or "{}")
            for i, c in sorted(self.calls.items())
        )


async def _events(
    parts: TurnParts, prepared: PreparedTurn, request: TurnRequest
) -> AsyncIterator[ModelEvent | UpstreamReply]:
    model = parts.model
    with cache_session(prepared.state.tenant, prepared.state.session_id):  # the session's prompt-cache hints
        if request.relay is not None and relays(model):
            left = max(1, window_left(parts, prepared))
            async for item in model.relay(prepared.messages, request.relay, max_tokens=left):
                yield item
            return
        cap = reply_cap(parts, prepared)
        if request.tools and calls_tools(model):
            async for event in model.stream_events(prepared.messages, tools=request.tools,
                                                   tool_choice=request.tool_choice, max_tokens=cap):
                yield event
            return
        async for text in model.stream(prepared.messages, max_tokens=cap):
            yield TextDelta(text=text)


async def stream_agent_turn(parts: TurnParts, request: TurnRequest) -> AsyncIterator[TurnEvent]:
    """`Engine.stream` for an agent step: ``Prepared``, then ``Delta`` and ``ToolCallPart`` events,
    then ``Done`` whose result carries the answer's tool calls (or ``Failed``). The answer (text and
    calls) is stored in a ``finally`` shielded from cancellation; a broken stream stores its text as
    partial and none of its calls (a half-received call is never stored as made)."""
    key = request.key
    mode = request.mode or parts.settings.mode
    new_user: Turn | None = None
    async with parts.one_connection():  # the step's store calls: one pooled connection, let go before the model
        await _store_results(parts, key, request.tool_results)
        if request.message is not None:
            message = request.message
            prepared = await prepare_turn(parts, request)
            new_user = prepared.retried or (await parts.store.append(key, parts.keepable(key.tenant, [
                NewTurn(role="user", content=message, tokens=parts.counter.count(message),
                        metadata=dict(request.metadata))]), user_id=request.user_id))[0]
            if prepared.retried is None:
                observe(parts, key, [new_user])
            user_turn = new_user
        else:
            prepared = await prepare_step(parts, key, mode=mode, system_prompt=request.system_prompt, now=request.now)
            user_turn = (await latest_user(parts, key, prepared.state))[1]
        await parts.let_go()
    yield Prepared(prepared=prepared)
    answer = _Answer(pieces=[], calls={})
    ending = Ending()
    error: ModelError | None = None
    completed = False
    started = time.perf_counter()
    try:
        async for event in _events(parts, prepared, request):
            if event.kind == "upstream":
                if not event.accepted_only:
                    ending.read(event, whole=not (request.relay and request.relay.stream))
                yield Upstream(reply=event)
                continue
            answer.add(event)
            yield Delta(text=event.text) if event.kind == "text" else ToolCallPart(call=event)
        completed = True
    except ModelError as exc:
        error = exc
    finally:
        text = "".join(answer.pieces)
        calls = answer.tool_calls() if completed else ()
        stored = await asyncio.shield(_store_answer(parts, key, user_turn, text, calls, completed))
        jobs = schedule_jobs(parts, key, new_user, prepared) if new_user is not None else []
    if error is not None:
        yield Failed(error=error, partial_answer=text, prepared=prepared)
        return
    result = TurnResult(
        answer=text, partial=False, user_turn=user_turn, assistant_turn=stored, prepared=prepared, jobs=jobs,
        model_ms=(time.perf_counter() - started) * 1000, tool_calls=calls,
        finish_reason=ending.finish_reason, stop_sequence=ending.stop_sequence, usage=ending.usage,
        upstream=ending.whole,
    )
    yield Done(result=result)


async def _store_answer(
    parts: TurnParts, key: SessionKey, user_turn: Turn, text: str, calls: tuple[ToolCall, ...], completed: bool
) -> Turn | None:
    if not text and not calls:
        return None
    meta: dict[str, Any] = {"reply_to": user_turn.seq, "model": parts.model.name}
    if not completed:
        meta["partial"] = True
    stored = await append_fenced(parts, key, parts.keepable(key.tenant, [
        NewTurn(role="assistant", content=text, tokens=count_turn(parts.counter, text, tool_calls=calls), metadata=meta,
                tool_calls=calls)]),
        holds=user_turn.seq)
    observe(parts, key, stored)
    return stored[0]
