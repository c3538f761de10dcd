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
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .assembly import CurrentTurn, assemble, to_messages
from .assembly.agent import split_step
from .errors import InputError, ModelError
from .memory.strategies import get_strategy
from .models.base import (
    ModelEvent,
    Relay,
    TextDelta,
    ToolChoice,
    ToolSpec,
    UpstreamReply,
    calls_tools,
    relays,
)
from .models.caching import cache_session
from .processors.base import Detection
from .tokens.tools import count_turn
from .types import NewTurn, SessionKey, SessionState, ToolCall, Turn, tool_metadata

if TYPE_CHECKING:
    from .engine import Engine, PreparedTurn, TurnEvent, UseDefault
    from .settings import Mode

__all__ = ["AgentRequest", "ToolResult", "stream_agent_turn"]


@dataclass(frozen=True, kw_only=True)
class ToolResult:
    """The result of one tool call, as the client sends it back."""

    call_id: str
    """The id of the call it answers."""
    content: str
    """What the tool returned (text; JSON stays as text)."""


@dataclass(frozen=True, kw_only=True)
class AgentRequest:
    """One step of an agent loop: a new user message, or the results of the last calls."""

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


def _answered_and_named(turns: Sequence[Turn]) -> tuple[set[str], dict[str, str]]:
    answered = {t.tool_call_id for t in turns if t.role == "tool" and t.tool_call_id}
    names = {c.id: c.name for t in turns for c in t.tool_calls}
    return answered, names


async def _store_results(engine: Engine, key: SessionKey, results: Sequence[ToolResult]) -> list[Turn]:
    """Append the results not stored yet (a client resending its history stores nothing twice)."""
    from .engine.persist import observe

    tenant, session_id = key.tenant, key.session_id
    state = await engine.store.load(tenant, session_id, recent=64, max_uncovered=64)
    answered, names = _answered_and_named(state.turns)
    fresh = [r for r in results if r.call_id not in answered]
    if not fresh:
        return []
    new = [
        NewTurn(
            role="tool",
            content=r.content,
            tokens=count_turn(engine.counter, r.content, tool_result=True),
            metadata=tool_metadata(tool_call_id=r.call_id, tool_name=names.get(r.call_id)),
        )
        for r in fresh
    ]
    stored = await engine.store.append(tenant, session_id, engine.keepable(tenant, new))
    observe(engine, key, stored)
    return stored


async def _latest_user(engine: Engine, key: SessionKey, state: SessionState) -> tuple[list[Turn], Turn, list[Turn]]:
    history, user, step = split_step(state.turns)
    if user is not None:
        return history, user, step
    # A long step pushed the user turn out of the loaded window: look further back.
    end = state.turns[0].seq - 1 if state.turns else state.last_seq
    while end >= 1:
        older = await engine.store.turns(key.tenant, key.session_id, from_seq=max(1, end - 199), to_seq=end)
        _, found, rest = split_step(older)
        if found is not None:
            return [], found, [*rest, *state.turns]
        end -= 200
    raise InputError("tool results need a user message before them in this session")


async def prepare_step(
    engine: Engine, key: SessionKey, *, mode: Mode, system_prompt: str | UseDefault | None,
    now: datetime | None = None,
) -> PreparedTurn:
    """The context for continuing an agent step: the latest user turn, then its calls and results."""
    from .engine import PreparedTurn
    from .engine.prepare import load_state

    started = time.perf_counter()
    chosen = get_strategy(engine.settings.strategy)
    state = await load_state(engine, key, chosen)
    history, user, step = await _latest_user(engine, key, state)
    context = assemble(
        replace(state, turns=tuple(history)), user.content, counter=engine.counter, strategy=chosen,
        budget=engine.budget(), config=engine.assembly_config(system_prompt), now=now, current=CurrentTurn(agent_step=step),
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
    engine: Engine, prepared: PreparedTurn, request: AgentRequest
) -> AsyncIterator[ModelEvent | UpstreamReply]:
    model = engine.model
    with cache_session(prepared.state.tenant, prepared.state.session_id):  # the session's prompt-cache hints
        if request.relay is not None and relays(model):
            left = max(1, engine.settings.context_window - prepared.context.total_tokens)
            async for item in model.relay(prepared.messages, request.relay, max_tokens=left):
                yield item
            return
        if request.tools and calls_tools(model):
            async for event in model.stream_events(prepared.messages, tools=request.tools,
                                                   tool_choice=request.tool_choice):
                yield event
            return
        async for text in model.stream(prepared.messages):
            yield TextDelta(text=text)


async def stream_agent_turn(
    engine: Engine,
    key: SessionKey,
    request: AgentRequest,
    *,
    mode: Mode | None = None,
    metadata: dict[str, Any] | None = None,
    system_prompt: str | UseDefault | None,
) -> AsyncIterator[TurnEvent]:
    """`Engine.stream` for an agent step: ``Prepared``, then ``Delta`` and ``ToolCallPart`` events,
    then ``Done`` whose result carries the answer's tool calls (or ``Failed``). The answer (text and
    calls) is stored in a ``finally`` shielded from cancellation; a broken stream stores its text as
    partial and none of its calls (a half-received call is never stored as made)."""
    from .engine import (
        Delta,
        Done,
        Failed,
        Prepared,
        ToolCallPart,
        TurnRequest,
        TurnResult,
        Upstream,
    )
    from .engine.persist import observe
    from .engine.prepare import prepare_turn
    from .engine.schedule import schedule_jobs
    from .engine.stream import Ending

    mode = mode or engine.settings.mode
    new_user: Turn | None = None
    async with engine.one_connection():  # the step's store calls: one pooled connection, let go before the model
        await _store_results(engine, key, request.tool_results)
        if request.message is not None:
            turn_request = TurnRequest(key=key, message=request.message, mode=mode, system_prompt=system_prompt,
                                       retry_window_s=request.retry_window_s)
            prepared = await prepare_turn(engine, turn_request)
            new_user = prepared.retried or (await engine.store.append(key.tenant, key.session_id, engine.keepable(key.tenant, [
                NewTurn(role="user", content=request.message, tokens=engine.counter.count(request.message),
                        metadata=dict(metadata or {}))])))[0]
            if prepared.retried is None:
                observe(engine, key, [new_user])
            user_turn = new_user
        else:
            prepared = await prepare_step(engine, key, mode=mode, system_prompt=system_prompt)
            user_turn = (await _latest_user(engine, key, prepared.state))[1]
        await engine.let_go()
    yield Prepared(prepared=prepared)
    answer = _Answer(pieces=[], calls={})
    ending = Ending()
    error: ModelError | None = None
    completed = False
    started = time.perf_counter()
    try:
        async for event in _events(engine, prepared, request):
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
        stored = await asyncio.shield(_store_answer(engine, key, user_turn, text, calls, completed))
        jobs = schedule_jobs(engine, key, new_user, prepared) if new_user is not None else []
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
    engine: Engine, key: SessionKey, user_turn: Turn, text: str, calls: tuple[ToolCall, ...], completed: bool
) -> Turn | None:
    from .engine.persist import append_fenced, observe

    if not text and not calls:
        return None
    meta: dict[str, Any] = {"reply_to": user_turn.seq, "model": engine.model.name, **tool_metadata(tool_calls=calls)}
    if not completed:
        meta["partial"] = True
    stored = await append_fenced(engine, key, engine.keepable(key.tenant, [
        NewTurn(role="assistant", content=text, tokens=count_turn(engine.counter, text, tool_calls=calls), metadata=meta)]),
        holds=user_turn.seq)
    observe(engine, key, stored)
    return stored[0]
