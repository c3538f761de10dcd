"""``POST /v1/chat/completions``: an OpenAI-compatible memory proxy.

An app using the openai SDK points its ``base_url`` at context-mode and sends
only its new message (the last ``user`` message of ``messages``) with a
session id (header ``X-Session-Id``, else the ``user`` field). A ``system``
(or ``developer``) message becomes the system prompt of that turn. context-mode
loads the session, builds the context and calls the engine's model; the reply
is an ordinary ``chat.completion`` (or ``chat.completion.chunk`` SSE stream
ending with ``data: [DONE]``). Errors take OpenAI's shape ``{"error": {...}}``.
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from ..engine import Engine
from ..errors import InputError
from ..types import validate_id
from .codes import code_for_exception, public_message
from .images import ImageFiles, decode_images
from .metrics import ServiceMetrics
from .sse import DONE, SSEResponse, sse_event
from .state import AppState, Tenant, app_state
from .turns import StartedStream, check_message, run_turn, start_stream

__all__ = ["ChatCompletionRequest", "ProxyMessage", "openai_error_body", "router"]

router = APIRouter(tags=["openai-compatible"])

State = Annotated[AppState, Depends(app_state)]

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
}


def openai_error_body(code: int, name: str, message: str) -> dict[str, Any]:
    """OpenAI's error shape, with the envelope code alongside."""
    status = code // 100
    kind = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": name, "contextmode_code": code}}


class ProxyMessage(BaseModel):
    """One message of the request; only the last ``user`` one and a ``system`` one are used."""

    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(BaseModel):
    """The subset of OpenAI's request the proxy reads; other fields are accepted and ignored."""

    model_config = ConfigDict(extra="allow")

    model: str | None = Field(default=None, description="Echoed back; the engine's model answers.")
    messages: list[ProxyMessage] = Field(min_length=1)
    stream: bool = False
    user: str | None = Field(
        default=None,
        description="The end user: names the session's user, and is the session id when no X-Session-Id header is sent.",
    )
    stream_options: dict[str, Any] | None = None


def _text_and_images(content: str | list[dict[str, Any]] | None) -> tuple[str, list[str]]:
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


def _chunk(completion_id: str, created: int, model: str, delta: dict[str, Any], finish: str | None) -> bytes:
    return sse_event(
        {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
    )


async def _chunks(
    started: StartedStream, engine: Engine, model: str, include_usage: bool, metrics: ServiceMetrics
) -> AsyncIterator[bytes]:
    completion_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    yield _chunk(completion_id, created, model, {"role": "assistant", "content": ""}, None)
    first = started.first
    assert first.prepared is not None
    try:
        async for event in started.events:
            if event.kind == "delta":
                yield _chunk(completion_id, created, model, {"content": event.text}, None)
            elif event.kind == "done" and event.result is not None:
                result = event.result
                started.outcome.finished(result, metrics)
                yield _chunk(completion_id, created, model, {}, "stop")
                if include_usage:
                    prompt = first.prepared.context.total_tokens
                    completion = engine.counter.count(result.answer)
                    yield sse_event(
                        {
                            "id": completion_id,
                            "object": "chat.completion.chunk",
                            "created": created,
                            "model": model,
                            "choices": [],
                            "usage": {
                                "prompt_tokens": prompt,
                                "completion_tokens": completion,
                                "total_tokens": prompt + completion,
                            },
                        }
                    )
    except Exception as exc:
        started.outcome.outcome = "error"
        row = code_for_exception(exc)
        yield sse_event(openai_error_body(row.code, row.name, public_message(exc, row)))
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
    x_session_id: Annotated[str | None, Header(description="The session this message belongs to.")] = None,
) -> Any:
    session_id = x_session_id or body.user
    if not session_id:
        raise InputError("name the session: header 'X-Session-Id' or the 'user' field")
    validate_id(session_id)
    user_id = validate_id(body.user, "user id") if body.user else None
    last_user = next((m for m in reversed(body.messages) if m.role == "user"), None)
    if last_user is None:
        raise InputError("messages must contain a user message")
    message, image_urls = _text_and_images(last_user.content)
    if not message.strip():
        raise InputError("the last user message has no text")
    check_message(message, state.settings)
    system = next((m for m in body.messages if m.role in ("system", "developer")), None)
    engine = state.engine
    if system is not None:
        # The system prompt is per engine; a shallow copy shares the store, model and job runner.
        engine = copy.copy(engine)
        engine.system_prompt = _text_and_images(system.content)[0] or None
    images = ImageFiles.write(decode_images(image_urls, state.settings), state.settings.image_dir)
    model = body.model or engine.model.name
    headers = {"x-session-id": session_id}
    turn: dict[str, Any] = {
        "mode": engine.settings.mode, "images": images, "metrics": state.metrics, "user_id": user_id,
    }
    if not body.stream:
        result = await run_turn(engine, tenant, session_id, message, **turn)
        prompt = result.prepared.context.total_tokens
        completion = engine.counter.count(result.answer)
        return JSONResponse(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": result.answer},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
            },
            headers=headers,
        )
    started = await start_stream(engine, tenant, session_id, message, **turn)
    include_usage = bool((body.stream_options or {}).get("include_usage"))
    events = _chunks(started, engine, model, include_usage, state.metrics)
    return SSEResponse(events, on_close=started.close, headers=headers)


@router.get("/v1/models", summary="The model behind the proxy (OpenAI shape)")
async def list_models(tenant: Tenant, state: State) -> Any:
    return {
        "object": "list",
        "data": [{"id": state.engine.model.name, "object": "model", "created": 0, "owned_by": "context-mode"}],
    }
