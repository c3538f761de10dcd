"""The OpenAI-compatible proxy's agent side: ``tools``, ``tool_choice``, assistant
``tool_calls`` and ``role: "tool"`` messages, streamed tool-call deltas included.

A request is an agent step when it offers ``tools`` or ends with ``tool``
messages. Its new items are the trailing ``tool`` messages (results of the
model's last calls; results already stored are not stored twice) or else the
last ``user`` message; the rest of ``messages`` is the client's copy of the
history, which the session already holds. The answer is a ``chat.completion``
whose message may carry ``tool_calls`` (``finish_reason: "tool_calls"``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from fastapi.responses import JSONResponse

from ..engine import USE_DEFAULT, Engine, TurnEvent, TurnResult, UseDefault
from ..engine.agent import AgentRequest, ToolResult
from ..errors import InputError
from ..models.base import ToolCallDelta, ToolChoice, ToolSpec
from ..types import JsonObject, JsonValue, SessionKey
from .codes import code_for_exception, public_message
from .metrics import ServiceMetrics
from .openai_wire import completion_chunk, usage_chunk
from .proxy import accepted_first
from .responses import openai_error_body
from .sse import DONE, sse_event
from .turns import Streamed, Whole, step_runners

__all__ = ["ProxyReply", "agent_request", "agent_step"]


class _Message(Protocol):
    @property
    def role(self) -> str: ...
    @property
    def content(self) -> object: ...


def _text(content: object) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p for p in content if isinstance(p, Mapping)]
        if any(p.get("type") != "text" for p in parts):
            raise InputError("agent steps take text content only (no images)")
        return "\n".join(str(p.get("text", "")) for p in parts)
    raise InputError("message content must be a string or a list of text parts")


def agent_request(
    messages: Sequence[_Message], tools: Sequence[ToolSpec] | None, tool_choice: ToolChoice | None
) -> AgentRequest | None:
    """The agent step a request carries, or ``None`` for a plain chat turn."""
    if not tools and messages[-1].role != "tool":
        return None
    results: list[ToolResult] = []
    for m in reversed(messages):
        if m.role != "tool":
            break
        call_id = getattr(m, "tool_call_id", None)
        if not isinstance(call_id, str) or not call_id:
            raise InputError("a 'tool' message needs its 'tool_call_id'")
        results.append(ToolResult(call_id=call_id, content=_text(m.content)))
    results.reverse()
    message = None
    if not results:
        last_user = next((m for m in reversed(messages) if m.role == "user"), None)
        if last_user is None:
            raise InputError("messages must contain a user message")
        message = _text(last_user.content)
        if not message.strip():
            raise InputError("the last user message has no text")
    if tool_choice is not None and not isinstance(tool_choice, str | Mapping):
        raise InputError("tool_choice must be a string or an object")
    return AgentRequest(message=message, tool_results=tuple(results), tools=tuple(tools or ()), tool_choice=tool_choice)


def _wire_calls(result: TurnResult) -> list[JsonValue]:
    return [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in result.tool_calls
    ]


def _usage(result: TurnResult) -> dict[str, int]:
    prompt = result.prepared.context.total_tokens
    completion = result.assistant_turn.tokens if result.assistant_turn else 0
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


@dataclass(frozen=True, kw_only=True)
class ProxyReply:
    """How the proxy answers this request (OpenAI's shape)."""

    model: str
    """The model name echoed back."""
    stream: bool
    include_usage: bool
    system_prompt: str | UseDefault | None = USE_DEFAULT
    """The request's ``system`` message (`USE_DEFAULT`: the engine's)."""
    headers: dict[str, str] = field(default_factory=dict)
    """The response's headers (the dict the route gives `serve_once`; a relayed step adds the
    endpoint's ``x-request-id``)."""


def _completion(result: TurnResult, reply: ProxyReply) -> JSONResponse:
    if result.upstream is not None:  # relayed: the endpoint's own completion
        return JSONResponse(dict(result.upstream.data), headers={**reply.headers, **result.upstream.headers})
    message: JsonObject = {"role": "assistant", "content": result.answer or None}
    if result.tool_calls:
        message["tool_calls"] = _wire_calls(result)
    return JSONResponse(
        {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": reply.model,
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if result.tool_calls else "stop"}],
            "usage": _usage(result),
        },
        headers=dict(reply.headers),
    )


def agent_step(
    engine: Engine, key: SessionKey, step: AgentRequest, reply: ProxyReply, metrics: ServiceMetrics
) -> tuple[Whole, Streamed]:
    """`serve_turn`'s runners for the step, answering in OpenAI's shape (a completion, or a chunk
    stream): under the session's turn lock and ``Idempotency-Key``, counted like a chat turn."""
    mode = engine.settings.mode

    def events() -> AsyncIterator[TurnEvent]:
        stream = engine.stream_agent(key, step, mode=mode, system_prompt=reply.system_prompt)
        return accepted_first(engine, stream, step.relay, reply.headers)

    return step_runners(
        events, mode, metrics,
        json=lambda result: _completion(result, reply),
        body=lambda _started, stream: _chunks(stream, reply),
    )


def _tool_call_chunk(call: ToolCallDelta) -> JsonObject:
    function: JsonObject = {"arguments": call.arguments}
    piece: JsonObject = {"index": call.index, "function": function}
    if call.id:
        piece["id"], piece["type"] = call.id, "function"
    if call.name:
        function["name"] = call.name
    return {"tool_calls": [piece]}


async def _chunks(events: AsyncIterator[TurnEvent], reply: ProxyReply) -> AsyncIterator[bytes]:
    model = reply.model
    completion_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    relayed = started = False
    try:
        async for event in events:
            if event.kind == "upstream":  # relayed: the endpoint's own chunks, as it sent them
                relayed = True
                if not event.reply.accepted_only:
                    yield sse_event(dict(event.reply.data))
                continue
            if relayed and event.kind != "failed":
                continue
            if not started and event.kind != "failed":
                started = True
                yield completion_chunk(completion_id, created, model, {"role": "assistant", "content": ""}, None)
            match event.kind:
                case "delta":
                    yield completion_chunk(completion_id, created, model, {"content": event.text}, None)
                case "tool_call":
                    yield completion_chunk(completion_id, created, model, _tool_call_chunk(event.call), None)
                case "done":
                    result = event.result
                    yield completion_chunk(completion_id, created, model, {}, "tool_calls" if result.tool_calls else "stop")
                    if reply.include_usage:
                        yield usage_chunk(completion_id, created, model, _usage(result))
                case "failed":
                    row = code_for_exception(event.error)
                    yield sse_event(openai_error_body(row.code, row.name, public_message(event.error, row)))
    except Exception as exc:
        row = code_for_exception(exc)
        yield sse_event(openai_error_body(row.code, row.name, public_message(exc, row)))
    yield DONE
