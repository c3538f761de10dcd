"""``POST /v1/chat/completions``: an OpenAI-compatible memory proxy.

An app using the openai SDK points its ``base_url`` at context-mode and sends its new
message (the last ``user`` message of ``messages``) with a session id (header
``X-Session-Id``, else the ``user`` field; any string, mapped reversibly: `proxy.mapped_id`).
Every ``system`` / ``developer`` message, in order, is the turn's system prompt (with the
memory notice). The request is relayed (`models.base.Relay`): every field but ``messages``
(memory composes them), ``model`` and ``stream`` reaches the engine's model as sent, the
length cap lowered to what the window leaves, and the answer is the model endpoint's own
``chat.completion`` (or its ``chat.completion.chunk`` stream, then ``data: [DONE]``); the
first choice is stored. Earlier messages are adopted on a session not seen yet
(`proxy.adopt_history`); ``X-Context-Memory: off`` is a side call (`proxy.side_call`).
Errors take OpenAI's shape ``{"error": {...}}``, a rate limit staying a 429 (docs/service.md).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from ..engine import Engine, TurnEvent, TurnRequest, TurnResult
from ..errors import InputError
from ..models.base import Relay
from ..types import JsonObject, JsonValue, SessionKey, check_storable
from .bodies import OffLoopJsonRoute
from .codes import code_for_exception, public_message
from .idempotency import IdempotencyKey, SessionHeader
from .openai_tools import ProxyReply, agent_request, agent_step
from .openai_wire import completion_chunk, usage_chunk
from .proxy import (
    HistoryHeader,
    MemoryHeader,
    ProxyChat,
    ReplyShape,
    chat_turn,
    mapped_id,
    side_call,
    system_prompt,
)
from .responses import openai_error_body
from .schemas import WireObject
from .sse import DONE, sse_event
from .state import AppState, Tenant, app_state
from .turns import StartedStream, check_message, check_tool_results, serve_once

__all__ = ["ChatCompletionRequest", "ProxyMessage", "client_history", "openai_error_body", "router", "system_texts", "text_and_images"]

router = APIRouter(tags=["openai-compatible"], route_class=OffLoopJsonRoute)

State = Annotated[AppState, Depends(app_state)]

class ProxyMessage(BaseModel):
    """One message of the request: the last ``user`` one is the new message, ``system`` /
    ``developer`` ones the system prompt, earlier ones the app's history (adopted once)."""

    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[WireObject] | None = None
    tool_calls: list[WireObject] | None = Field(default=None, description="Assistant messages: the calls it made.")
    tool_call_id: str | None = Field(default=None, description="'tool' messages: the call this result answers.")


class ChatCompletionRequest(BaseModel):
    """The fields of OpenAI's request the proxy reads; every other one is relayed as sent."""

    model_config = ConfigDict(extra="allow")

    model: str | None = Field(default=None, description="The engine's model answers (this name is echoed only by a model that cannot relay).")
    messages: list[ProxyMessage] = Field(min_length=1)
    stream: StrictBool = False
    user: str | None = Field(
        default=None,
        description="The end user: names the session's user, and is the session id when no X-Session-Id header is sent.",
    )
    stream_options: WireObject | None = None
    tools: list[WireObject] | None = Field(default=None, description="Tools offered to the model (passed through).")
    tool_choice: str | WireObject | None = None

    @model_validator(mode="before")
    @classmethod
    def _cheap_shape_check(cls, data: object) -> object:
        # One error for the first malformed message, instead of one per message.
        messages = data.get("messages") if isinstance(data, dict) else None
        if isinstance(messages, list):
            for i, message in enumerate(messages):
                if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                    raise ValueError(f"messages[{i}] must be an object with a string 'role'")
        check_storable(data, "request")  # NUL, lone surrogates: in tool results, names, ids too
        return data


def text_and_images(content: str | Sequence[Mapping[str, JsonValue]] | None) -> tuple[str, list[str]]:
    if content is None:
        return "", []
    if isinstance(content, str):
        return content, []
    texts: list[str] = []
    images: list[str] = []
    for part in content:
        kind = part.get("type")
        if kind == "text":
            texts.append(str(part.get("text", "")))
        elif kind == "image_url":
            url = part.get("image_url")
            images.append(str(url.get("url", "") if isinstance(url, dict) else url or ""))
        else:
            raise InputError(f"unsupported content part type {kind!r} (text and image_url are)")
    return "\n".join(texts), images


def _usage(engine: Engine, prompt: int, answer: str) -> dict[str, int]:
    completion = engine.counter.count(answer)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _error_chunk(exc: Exception, partial: str) -> bytes:
    row = code_for_exception(exc)
    data: JsonObject = {"partial_answer": partial, "interrupted": True}
    return sse_event(openai_error_body(row.code, row.name, public_message(exc, row), data))


async def _chunks(
    events: AsyncIterator[TurnEvent], engine: Engine, model: str, include_usage: bool, prompt_tokens: int
) -> AsyncIterator[bytes]:
    """The turn's events as ``chat.completion.chunk`` SSE, ending with ``[DONE]``: the model
    endpoint's own chunks as it sent them when the request was relayed (``Upstream`` events),
    else chunks made from the answer's text."""
    completion_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    pieces: list[str] = []
    started = relayed = False
    try:
        async for event in events:
            if event.kind == "upstream":
                relayed = True
                if not event.reply.accepted_only:
                    yield sse_event(dict(event.reply.data))
                continue
            if relayed or event.kind not in ("delta", "done"):
                if event.kind == "failed":
                    yield _error_chunk(event.error, event.partial_answer)
                continue
            if not started:
                started = True
                yield completion_chunk(completion_id, created, model, {"role": "assistant", "content": ""}, None)
            if event.kind == "delta":
                pieces.append(event.text)
                yield completion_chunk(completion_id, created, model, {"content": event.text}, None)
            else:
                yield completion_chunk(completion_id, created, model, {}, event.result.finish_reason or "stop")
                if include_usage:
                    yield usage_chunk(completion_id, created, model, _usage(engine, prompt_tokens, event.result.answer))
    except Exception as exc:
        yield _error_chunk(exc, "".join(pieces))
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    yield DONE


@router.post(
    "/v1/chat/completions",
    summary="OpenAI-compatible chat completions with context-mode's memory",
    responses={200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}}},
)
async def chat_completions(
    body: ChatCompletionRequest,
    tenant: Tenant,
    state: State,
    x_session_id: SessionHeader = None,
    idempotency_key: IdempotencyKey = None,
    memory: MemoryHeader = None,
    history: HistoryHeader = None,
) -> Any:
    if memory == "off":
        messages = [m.model_dump(exclude_unset=True) for m in body.messages]
        side = Relay(fields={**_forwarded(body), "messages": messages}, stream=body.stream)
        return await side_call(state.engine, side, {}, state.settings.sse_ping_s)
    raw_session = x_session_id or body.user
    if not raw_session:
        raise InputError("name the session: header 'X-Session-Id' or the 'user' field")
    key = SessionKey(tenant, mapped_id(raw_session))
    user_id = mapped_id(body.user, "user id") if body.user else None
    system = system_prompt(system_texts(body.messages), state.engine.settings.locale)
    include_usage = bool((body.stream_options or {}).get("include_usage"))
    model = body.model or state.engine.model.name
    headers = {"x-session-id": key.session_id}
    engine = state.engine
    relay = Relay(fields=_forwarded(body), stream=body.stream)
    step = agent_request(body.messages, body.tools, body.tool_choice)
    if step is not None:
        check_tool_results(step.tool_results, state.settings)
        reply = ProxyReply(model=model, stream=body.stream, include_usage=include_usage,
                           system_prompt=system, headers=headers)
        agent = replace(step, relay=relay, retry_window_s=state.settings.retry_window_s)
        whole, streamed = agent_step(engine, key, agent, reply, state.metrics)
    else:
        request, image_urls = _chat_request(body, key, user_id, idempotency_key, state)
        relay = replace(relay, images=tuple(image_urls))  # checked by the image boundary first (`_chat_turn`)
        request = replace(request, system_prompt=system, relay=relay, retry_window_s=state.settings.retry_window_s)
        earlier = [] if history == "ignore" else client_history(body.messages)
        shape = _chat_shape(engine, model, include_usage, headers)
        whole, streamed = chat_turn(ProxyChat(request=request, image_urls=image_urls, history=earlier), state, shape)
    return await serve_once(
        state, key, idempotency_key, "chat.completions", body.model_dump_json(),
        whole=None if body.stream else whole, streamed=streamed, headers=headers,
    )


_OWNED = frozenset({"messages", "model", "stream"})
"""Request fields the proxy does not pass on as sent: memory composes ``messages``, the
engine's model answers (``model``), and ``stream`` is the model call's own (the same value)."""


def _forwarded(body: ChatCompletionRequest) -> JsonObject:
    """The request's fields as the client sent them, but those the proxy owns (`_OWNED`)."""
    return body.model_dump(exclude_unset=True, exclude=set(_OWNED))


def client_history(messages: list[ProxyMessage]) -> list[tuple[Literal["user", "assistant"], str]]:
    """The client's own conversation before its last ``user`` message (text of ``user`` and
    plain ``assistant`` messages), for a session the service has not seen."""
    last = max((i for i, m in enumerate(messages) if m.role == "user"), default=0)
    earlier: list[tuple[Literal["user", "assistant"], str]] = []
    for message in messages[:last]:
        if message.role == "user":
            earlier.append(("user", text_and_images(message.content)[0]))
        elif message.role == "assistant" and not message.tool_calls:
            earlier.append(("assistant", text_and_images(message.content)[0]))
    return earlier


def _chat_request(
    body: ChatCompletionRequest, key: SessionKey, user_id: str | None,
    idempotency_key: str | None, state: AppState,
) -> tuple[TurnRequest, list[str]]:
    """The chat turn the request carries (its last ``user`` message), checked, and its image URLs."""
    last_user = next((m for m in reversed(body.messages) if m.role == "user"), None)
    if last_user is None:
        raise InputError("messages must contain a user message")
    message, image_urls = text_and_images(last_user.content)
    if not message.strip():
        raise InputError("the last user message has no text")
    check_message(message, state.settings)
    request = TurnRequest(key=key, message=message, mode=state.engine.settings.mode,
                          user_id=user_id, idempotency_key=idempotency_key)
    return request, image_urls


def _chat_shape(engine: Engine, model: str, include_usage: bool, headers: dict[str, str]) -> ReplyShape:
    """A chat turn's answer in OpenAI's chat shape: the endpoint's own completion or chunks when
    relayed, else made from the answer."""

    def whole(result: TurnResult) -> Response:
        if result.upstream is not None:
            return JSONResponse(dict(result.upstream.data), headers={**headers, **result.upstream.headers})
        choice = {"index": 0, "message": {"role": "assistant", "content": result.answer},
                  "finish_reason": result.finish_reason or "stop"}
        return JSONResponse(
            {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
             "model": model, "choices": [choice],
             "usage": _usage(engine, result.prepared.context.total_tokens, result.answer)},
            headers=headers,
        )

    def stream(started: StartedStream, events: AsyncIterator[TurnEvent]) -> AsyncIterator[bytes]:
        return _chunks(events, engine, model, include_usage, started.prepared.context.total_tokens)

    return ReplyShape(path="/v1/chat/completions", json=whole, sse=stream, headers=headers)


def system_texts(messages: list[ProxyMessage]) -> list[str]:
    """Every ``system`` / ``developer`` message's text, in order."""
    return [text_and_images(m.content)[0] for m in messages if m.role in ("system", "developer")]


@router.get("/v1/models", summary="The model behind the proxy (OpenAI shape)")
async def list_models(tenant: Tenant, state: State) -> Any:
    return {
        "object": "list",
        "data": [{"id": state.engine.model.name, "object": "model", "created": 0, "owned_by": "context-mode"}],
    }
