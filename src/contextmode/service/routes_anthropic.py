"""``POST /v1/messages``: an Anthropic-compatible memory proxy.

An app using the anthropic SDK points its ``base_url`` at context-mode and sends
its new message (the last ``user`` message of ``messages``) with a session id
(header ``X-Session-Id``, else ``metadata.user_id``). ``system`` becomes the
system prompt of that turn. Memory is applied exactly as in the OpenAI-compatible
proxy (`routes_openai`): the same turn runner, session lock, ``Idempotency-Key``
replays, image checks, metrics and agent steps; only the wire shapes differ
(`anthropic_wire`): the reply is a ``message`` (or its event stream:
``message_start``, ``ping``, ``content_block_start`` / ``_delta`` / ``_stop``,
``message_delta``, ``message_stop``), errors are ``{"type": "error", "error": {...}}``.

With ``tools`` (or a last user message of ``tool_result`` blocks) the request is
an agent step (`Engine.stream_agent`): the model may answer with ``tool_use`` blocks
(``stop_reason: "tool_use"``), streamed as ``input_json_delta`` pieces. Agent steps
too run under the session's turn lock and honour ``Idempotency-Key``.

``POST /v1/messages/count_tokens`` answers ``{"input_tokens": N}`` for the context a turn
with the last user message would send now (``Engine.prepare``: nothing written).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response

from ..engine import Engine, TurnEvent, TurnRequest, TurnResult, UseDefault
from ..engine.agent import AgentRequest
from ..errors import InputError
from ..models.base import Relay
from ..types import SessionKey
from .anthropic_wire import (
    MessagesRequest,
    WireItem,
    agent_step,
    message_body,
    message_events,
    openai_fields,
    openai_tool_choice,
    openai_tools,
    system_text,
    wire_items,
)
from .bodies import OffLoopJsonRoute
from .idempotency import IdempotencyKey, SessionHeader
from .proxy import (
    HistoryHeader,
    ProxyChat,
    ReplyShape,
    accepted_first,
    chat_turn,
    mapped_id,
    system_prompt,
)
from .state import AppState, Tenant, app_state
from .turns import (
    StartedStream,
    Streamed,
    Whole,
    check_message,
    check_tool_results,
    serve_once,
    step_runners,
)

__all__ = ["router"]

router = APIRouter(tags=["anthropic-compatible"], route_class=OffLoopJsonRoute)

State = Annotated[AppState, Depends(app_state)]
PATH = "/v1/messages"


def _session(body: MessagesRequest, header: str | None) -> tuple[str, str | None]:
    """The session and user ids (any string, mapped reversibly: `proxy.mapped_id`)."""
    user = body.user_id()
    session_id = header or user
    if not session_id:
        raise InputError("name the session: header 'X-Session-Id' or metadata.user_id")
    return mapped_id(session_id), mapped_id(user, "user id") if user else None


def _last_user(items: list[WireItem]) -> WireItem:
    if items[-1].role == "assistant":
        raise InputError("the last message must be the user's (a prefilled assistant message is not supported)")
    last_user = next((i for i in reversed(items) if i.role == "user" and not i.tool_results), None)
    if last_user is None:
        raise InputError("messages must contain a user message")
    return last_user


@dataclass(frozen=True, kw_only=True)
class _Call:
    """What both kinds of request (a chat turn, an agent step) answer with."""

    engine: Engine
    key: SessionKey
    system_prompt: str | UseDefault | None
    """The request's ``system`` (`USE_DEFAULT`, the engine's, when it has none)."""
    model: str
    state: AppState
    headers: dict[str, str]

    def body(self, started: StartedStream, events: AsyncIterator[TurnEvent]) -> AsyncIterator[bytes]:
        """The stream of a started turn in Anthropic's events (`start_stream` counts its outcome)."""
        return message_events(events, self.engine, model=self.model,
                              input_tokens=started.prepared.context.total_tokens)

    def json(self, result: TurnResult) -> Response:
        upstream = result.upstream.headers if result.upstream is not None else {}
        return JSONResponse(message_body(self.engine, result, self.model), headers={**self.headers, **upstream})


@router.post(
    PATH,
    summary="Anthropic-compatible messages with context-mode's memory",
    responses={200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}}},
)
async def create_message(
    body: MessagesRequest,
    tenant: Tenant,
    state: State,
    x_session_id: SessionHeader = None,
    idempotency_key: IdempotencyKey = None,
    history: HistoryHeader = None,
) -> Any:
    session_id, user_id = _session(body, x_session_id)
    items = wire_items(body.messages)
    last_user = _last_user(items) if not items[-1].tool_results else None
    engine = state.engine
    call = _Call(engine=engine, key=SessionKey(tenant, session_id), system_prompt=_system_prompt(body, engine),
                 model=body.model or engine.model.name, state=state, headers={"x-session-id": session_id})
    relay = Relay(fields=openai_fields(body), stream=body.stream)
    step = agent_step(items, openai_tools(body.tools), openai_tool_choice(body.tool_choice))
    if step is not None:
        check_tool_results(step.tool_results, state.settings)
        if last_user is not None and last_user.images:
            raise InputError("agent steps take text content only (no images)")
        whole, streamed = _agent_step(call, replace(step, relay=relay, retry_window_s=state.settings.retry_window_s))
    else:
        assert last_user is not None
        if not last_user.content.strip():
            raise InputError("the last user message has no text")
        check_message(last_user.content, state.settings)
        request = TurnRequest(key=call.key, message=last_user.content, mode=engine.settings.mode,
                              system_prompt=call.system_prompt, user_id=user_id, idempotency_key=idempotency_key,
                              relay=replace(relay, images=last_user.images),
                              retry_window_s=state.settings.retry_window_s)
        earlier = [] if history == "ignore" else _history(items)
        shape = ReplyShape(path=PATH, json=call.json, sse=call.body, headers=call.headers)
        whole, streamed = chat_turn(ProxyChat(request=request, image_urls=list(last_user.images), history=earlier),
                                    state, shape)
    return await serve_once(
        state, call.key, idempotency_key, "messages", body.model_dump_json(),
        whole=None if body.stream else whole, streamed=streamed, headers=call.headers,
    )


def _system_prompt(body: MessagesRequest, engine: Engine) -> str | UseDefault | None:
    """The request's ``system`` as the turn's system prompt, with the memory notice
    (`proxy.system_prompt`; the engine's own when it has none)."""
    text = system_text(body.system)
    return system_prompt([text] if text else [], engine.settings.locale)


def _history(items: list[WireItem]) -> list[tuple[Literal["user", "assistant"], str]]:
    """The client's conversation before its last user message (for a session not seen yet)."""
    last = max((i for i, item in enumerate(items) if item.role == "user"), default=0)
    return [(i.role, i.content) for i in items[:last] if not i.tool_results]


def _agent_step(call: _Call, step: AgentRequest) -> tuple[Whole, Streamed]:
    """An agent step (`Engine.stream_agent`), run as the OpenAI proxy runs it (`step_runners`),
    under the same session lock and ``Idempotency-Key`` as a chat turn."""
    engine = call.engine
    mode = engine.settings.mode

    def events() -> AsyncIterator[TurnEvent]:
        stream = engine.stream_agent(call.key, step, mode=mode, system_prompt=call.system_prompt)
        return accepted_first(engine, stream, step.relay, call.headers)

    return step_runners(events, mode, call.state.metrics, json=call.json, body=call.body)


@router.post(
    f"{PATH}/count_tokens",
    summary="Tokens of the context context-mode would send for this message (writes nothing)",
)
async def count_tokens(
    body: MessagesRequest,
    tenant: Tenant,
    state: State,
    x_session_id: SessionHeader = None,
) -> Any:
    """``input_tokens``: the assembled context for the last user message (summary, pins, recall,
    recent turns, the message), counted as the model would receive it; tool definitions are not counted."""
    session_id, _ = _session(body, x_session_id)
    items = wire_items(body.messages)
    if items[-1].tool_results:
        raise InputError("count_tokens counts a user text message, not tool results")
    message = _last_user(items).content
    check_message(message, state.settings)
    request = TurnRequest(key=SessionKey(tenant, session_id), message=message,
                          system_prompt=_system_prompt(body, state.engine))
    prepared = await state.engine.prepare(request)
    return JSONResponse({"input_tokens": prepared.context.total_tokens}, headers={"x-session-id": session_id})
