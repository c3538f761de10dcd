"""Anthropic's Messages API on the wire: the request the proxy reads, the message it answers,
its stream events and its error shape (``POST /v1/messages``, see `routes_anthropic`).

Only the shapes live here; the turn itself runs on the same machinery as the
OpenAI-compatible proxy (`turns`, the engine's ``stream`` / ``stream_agent``). The messages
are read straight into the engine's terms (`WireItem`: text, images, `ToolResult`s; an
agent step as an `AgentRequest`, `agent_step`), never through OpenAI's message shape; the
tools are the engine's `ToolSpec`s. Content blocks are read as follows:

- ``text`` blocks are joined with newlines; ``image`` blocks (base64 source, or a
  ``data:`` URL) go through the service's image checks like the OpenAI proxy's
  ``image_url`` parts;
- a ``tool_result`` block in a user message is the result of the model's call
  ``tool_use_id`` (an ``is_error`` result is stored with a ``[tool error]`` prefix);
- ``tool_use`` and ``thinking`` blocks of the client's assistant messages are its
  copy of the history, which the session already holds: they are skipped.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from ..engine import Delta, Engine, ToolCallPart, TurnEvent, TurnResult
from ..engine.agent import AgentRequest
from ..errors import InputError
from ..models.base import ToolChoice, ToolSpec
from ..types import JsonObject, JsonValue, ToolResult, check_storable
from .codes import code_for_exception, public_message
from .schemas import WireObject

__all__ = [
    "AnthropicMessage",
    "MessagesRequest",
    "WireItem",
    "agent_step",
    "anthropic_error_body",
    "message_body",
    "message_events",
    "openai_fields",
    "openai_tool_choice",
    "openai_tools",
    "wire_items",
]

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def anthropic_error_body(code: int, name: str, message: str, data: JsonValue = None) -> JsonObject:
    """Anthropic's error shape ``{"type": "error", "error": {"type", "message"}}``, with the
    service's code name, envelope code (and any ``data``) alongside."""
    status = code // 100
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    error: JsonObject = {"type": kind, "message": message, "code": name, "contextmode_code": code}
    if data is not None:
        error["contextmode_data"] = data
    return {"type": "error", "error": error}


class AnthropicMessage(BaseModel):
    """One message of the request: a string, or a list of content blocks."""

    model_config = ConfigDict(extra="allow")

    role: Literal["user", "assistant"]
    content: str | list[WireObject]


class MessagesRequest(BaseModel):
    """The subset of Anthropic's request the proxy reads; the other fields are accepted and sent
    to the model in OpenAI's names (`openai_fields`)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = Field(default=None, description="Echoed back; the engine's model answers.")
    max_tokens: int | None = Field(default=None, description="The reply's cap (lowered to what the context window leaves).")
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[WireObject] | None = Field(default=None, description="This turn's system prompt.")
    metadata: WireObject | None = Field(
        default=None,
        description="metadata.user_id names the session's user, and is the session id when no X-Session-Id header is sent.",
    )
    stream: StrictBool = False
    tools: list[WireObject] | None = Field(default=None, description="Tools offered to the model.")
    tool_choice: WireObject | None = None

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: object) -> object:
        check_storable(data, "request")  # NUL, lone surrogates: in tool results, names, ids too
        return data

    def user_id(self) -> str | None:
        value = (self.metadata or {}).get("user_id")
        return value if isinstance(value, str) and value else None


@dataclass(frozen=True)
class WireItem:
    """One message of the request in the engine's terms."""

    role: Literal["user", "assistant"]
    content: str
    images: tuple[str, ...] = field(default=())
    tool_results: tuple[ToolResult, ...] = field(default=())
    """A user message of ``tool_result`` blocks: the results of the model's calls, in order."""


def _text_of(content: JsonValue) -> str:
    """A tool result's content: a string, or a list of text blocks."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        parts = [b for b in content if isinstance(b, Mapping)]
        if any(b.get("type") != "text" for b in parts):
            raise InputError("tool_result content takes text blocks only")
        return "\n".join(str(b.get("text", "")) for b in parts)
    raise InputError("tool_result content must be a string or a list of text blocks")


def _image_url(block: Mapping[str, JsonValue]) -> str:
    source = block.get("source")
    if not isinstance(source, Mapping):
        raise InputError("an image block needs a 'source'")
    if source.get("type") == "base64":
        return f"data:{source.get('media_type', '')};base64,{source.get('data', '')}"
    # A URL source: only data: URLs pass the image checks (the service fetches nothing).
    return str(source.get("url", ""))


def _user_item(blocks: Sequence[Mapping[str, JsonValue]]) -> WireItem:
    texts: list[str] = []
    images: list[str] = []
    results: list[ToolResult] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "image":
            images.append(_image_url(block))
        elif kind == "tool_result":
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str) or not call_id:
                raise InputError("a tool_result block needs its 'tool_use_id'")
            text = _text_of(block.get("content"))
            if block.get("is_error"):
                text = f"[tool error] {text}"
            results.append(ToolResult(call_id=call_id, content=text))
        else:
            raise InputError(f"unsupported content block type {kind!r} (text, image and tool_result are)")
    if results:
        if texts or images:
            raise InputError("send tool_result blocks without text or images in the same message")
        return WireItem(role="user", content="", tool_results=tuple(results))
    return WireItem(role="user", content="\n".join(texts), images=tuple(images))


def wire_items(messages: Sequence[AnthropicMessage]) -> list[WireItem]:
    """The request's messages, one item each (a user message of ``tool_result`` blocks carries
    them as `ToolResult`s)."""
    items: list[WireItem] = []
    for message in messages:
        if isinstance(message.content, str):
            items.append(WireItem(role=message.role, content=message.content))
        elif message.role == "user":
            items.append(_user_item(message.content))
        else:
            text = "\n".join(str(b.get("text", "")) for b in message.content if b.get("type") == "text")
            items.append(WireItem(role="assistant", content=text))
    return items


def agent_step(
    items: Sequence[WireItem], tools: Sequence[ToolSpec] | None, tool_choice: ToolChoice | None
) -> AgentRequest | None:
    """The agent step the request carries (tools offered, or tool results sent back), or ``None``
    for a plain chat turn: the results of the trailing ``tool_result`` messages, else the last
    user message's text."""
    if not tools and not items[-1].tool_results:
        return None
    results: list[ToolResult] = []
    for item in reversed(items):
        if not item.tool_results:
            break
        results[:0] = item.tool_results
    message = None
    if not results:
        last_user = next((i for i in reversed(items) if i.role == "user"), None)
        if last_user is None:
            raise InputError("messages must contain a user message")
        message = last_user.content
        if not message.strip():
            raise InputError("the last user message has no text")
    return AgentRequest(message=message, tool_results=tuple(results), tools=tuple(tools or ()), tool_choice=tool_choice)


def system_text(system: str | Sequence[Mapping[str, JsonValue]] | None) -> str | None:
    """The system prompt: a string or text blocks (``cache_control`` and the like are ignored)."""
    if system is None or isinstance(system, str):
        return system or None
    return "\n".join(str(b.get("text", "")) for b in system if b.get("type") == "text") or None


def openai_tools(tools: Sequence[Mapping[str, JsonValue]] | None) -> list[JsonObject] | None:
    """Anthropic's tool definitions (``name``, ``description``, ``input_schema``) as OpenAI's."""
    if not tools:
        return None
    out: list[JsonObject] = []
    for tool in tools:
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise InputError("every tool needs a 'name'")
        function: JsonObject = {"name": name, "parameters": tool.get("input_schema") or {"type": "object"}}
        if tool.get("description"):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def openai_tool_choice(choice: Mapping[str, JsonValue] | None) -> str | JsonObject | None:
    """``{"type": "auto" | "any" | "none" | "tool", "name"}`` as OpenAI's ``tool_choice``."""
    if choice is None:
        return None
    kind = choice.get("type")
    if kind in ("auto", "none"):
        return str(kind)
    if kind == "any":
        return "required"
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise InputError("tool_choice must be {'type': 'auto' | 'any' | 'none'} or {'type': 'tool', 'name': ...}")


def _tool_input(arguments: str) -> JsonObject:
    """A call's arguments as the object a ``tool_use`` block carries (raw text kept if not one)."""
    try:
        parsed: JsonValue = json.loads(arguments or "{}")
    except ValueError:
        return {"arguments": arguments}
    return parsed if isinstance(parsed, dict) else {"arguments": parsed}


_NOT_OPENAI = frozenset({
    "model", "messages", "system", "stream", "max_tokens", "metadata", "stop_sequences", "tools", "tool_choice",
    "thinking", "service_tier", "container", "mcp_servers", "context_management", "output_config",
    "cache_control", "diagnostics", "inference_geo", "speed", "user_profile_id", "workspace_id",
})
"""Anthropic's own request fields: mapped to their OpenAI twins by `openai_fields`, or owned by
the proxy, or with no twin; any other field (``temperature``, ``top_p``, ``top_k``, an
``extra_body`` field) is sent as it is."""


def openai_fields(body: MessagesRequest) -> JsonObject:
    """The request's fields in OpenAI's names, for a model endpoint that speaks OpenAI:
    ``max_tokens``, ``stop_sequences`` → ``stop``, ``tools`` and ``tool_choice`` converted,
    ``disable_parallel_tool_use`` → ``parallel_tool_calls: false``, ``thinking`` →
    ``reasoning_effort`` (by its token budget), ``output_config`` (`_output_config`),
    ``metadata.user_id`` → ``user``, a stream asks for its usage (``stream_options``); Anthropic's own
    fields with no twin are dropped (`_NOT_OPENAI`); the rest as sent."""
    sent: JsonObject = body.model_dump(exclude_unset=True)
    fields: JsonObject = {k: v for k, v in sent.items() if k not in _NOT_OPENAI}
    if body.max_tokens is not None:
        fields["max_tokens"] = body.max_tokens
    stop = sent.get("stop_sequences")
    if isinstance(stop, list) and stop:
        fields["stop"] = stop
    if tools := openai_tools(body.tools):
        fields["tools"] = [*tools]  # list is invariant: the same objects, as JSON values
    if (choice := openai_tool_choice(body.tool_choice)) is not None:
        fields["tool_choice"] = choice
    if (body.tool_choice or {}).get("disable_parallel_tool_use") is True:
        fields["parallel_tool_calls"] = False
    thinking = sent.get("thinking")
    if isinstance(thinking, Mapping) and thinking.get("type") == "enabled":
        budget = thinking.get("budget_tokens")
        size = budget if isinstance(budget, int) else 0
        fields["reasoning_effort"] = "low" if size < 4096 else "medium" if size < 16384 else "high"
    fields.update(_output_config(sent.get("output_config")))
    if user := body.user_id():
        fields["user"] = user
    if body.stream:  # the usage (cached tokens included) comes as a last chunk
        fields["stream_options"] = {"include_usage": True}
    return fields


def _output_config(config: JsonValue) -> JsonObject:
    """``output_config`` in OpenAI's names: ``effort`` → ``reasoning_effort`` (``xhigh`` and
    ``max`` → ``high``), a ``json_schema`` ``format`` → ``response_format``."""
    if not isinstance(config, Mapping):
        return {}
    out: JsonObject = {}
    effort = config.get("effort")
    if isinstance(effort, str):
        out["reasoning_effort"] = effort if effort in ("low", "medium", "high") else "high"
    form = config.get("format")
    if isinstance(form, Mapping) and form.get("type") == "json_schema":
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": form.get("schema")}}
    return out


def output_tokens(engine: Engine, result: TurnResult) -> int:
    completion = (result.usage or {}).get("completion_tokens")
    if isinstance(completion, int):  # the model endpoint's own count
        return completion
    return result.assistant_turn.tokens if result.assistant_turn else engine.counter.count(result.answer)


def input_tokens(result: TurnResult) -> int:
    """Input tokens as Anthropic counts them: without those read from the prompt cache."""
    prompt = (result.usage or {}).get("prompt_tokens")
    total = prompt if isinstance(prompt, int) else result.prepared.context.total_tokens
    return max(0, total - _cache_usage(result).get("cache_read_input_tokens", 0))


def _cache_usage(result: TurnResult) -> dict[str, int]:
    """``cache_read_input_tokens``: what the model endpoint said it read from its prompt cache
    (docs/caching.md), when it said; nothing otherwise."""
    cached = result.reported.cached_tokens if result.reported is not None else None
    return {"cache_read_input_tokens": cached} if cached is not None else {}


def _stop_reason(result: TurnResult) -> str:
    """How the answer ended, in Anthropic's words: ``tool_use``, ``max_tokens`` (the endpoint's
    ``length``), ``stop_sequence`` (an endpoint that names the stop string it met, as vLLM
    does), else ``end_turn``."""
    if result.tool_calls:
        return "tool_use"
    if result.finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if result.stop_sequence else "end_turn"


def message_body(engine: Engine, result: TurnResult, model: str) -> JsonObject:
    """A finished turn as Anthropic's ``message`` object."""
    content: list[JsonValue] = []
    if result.answer or not result.tool_calls:
        content.append({"type": "text", "text": result.answer})
    content.extend(
        {"type": "tool_use", "id": c.id, "name": c.name, "input": _tool_input(c.arguments)} for c in result.tool_calls
    )
    return {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": _stop_reason(result),
        "stop_sequence": result.stop_sequence,
        "usage": {"input_tokens": input_tokens(result), "output_tokens": output_tokens(engine, result),
                  **_cache_usage(result)},
    }


def sse(name: str, payload: Mapping[str, JsonValue]) -> bytes:
    """One named event (``event:`` then ``data:``), as Anthropic streams them."""
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"event: {name}\ndata: {data}\n\n".encode()


@dataclass
class _Blocks:
    """The content blocks opened so far while a stream runs."""

    count: int = 0
    open: tuple[str, int] | None = None
    """``("text", -1)`` or ``("tool_use", call index)`` of the block being streamed."""

    def close(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        self.count += 1
        return [sse("content_block_stop", {"type": "content_block_stop", "index": self.count - 1})]

    def start(self, key: tuple[str, int], block: JsonObject) -> list[bytes]:
        out = self.close()
        self.open = key
        out.append(sse("content_block_start", {"type": "content_block_start", "index": self.count, "content_block": block}))
        return out

    def delta(self, delta: JsonObject) -> bytes:
        return sse("content_block_delta", {"type": "content_block_delta", "index": self.count, "delta": delta})


def _event_bytes(event: Delta | ToolCallPart, blocks: _Blocks) -> list[bytes]:
    """The stream events for one text or tool-call event of the turn."""
    out: list[bytes] = []
    if event.kind == "delta":
        if blocks.open != ("text", -1):
            out += blocks.start(("text", -1), {"type": "text", "text": ""})
        out.append(blocks.delta({"type": "text_delta", "text": event.text}))
    else:
        call = event.call
        if blocks.open != ("tool_use", call.index):
            block: JsonObject = {
                "type": "tool_use", "id": call.id or f"call_{call.index}", "name": call.name or "", "input": {},
            }
            out += blocks.start(("tool_use", call.index), block)
        if call.arguments:
            out.append(blocks.delta({"type": "input_json_delta", "partial_json": call.arguments}))
    return out


def _error_event(exc: Exception, partial: str) -> bytes:
    """A failure mid-stream as an ``error`` event, carrying the partial answer that was stored."""
    row = code_for_exception(exc)
    data: JsonObject = {"partial_answer": partial, "interrupted": True}
    return sse("error", anthropic_error_body(row.code, row.name, public_message(exc, row), data))


def _finish(result: TurnResult, blocks: _Blocks, engine: Engine) -> list[bytes]:
    """The end of a finished turn's stream: the last block closed, ``message_delta``, ``message_stop``."""
    out: list[bytes] = []
    if blocks.count == 0 and blocks.open is None and not result.tool_calls:
        out += blocks.start(("text", -1), {"type": "text", "text": ""})
    out += blocks.close()
    out.append(sse("message_delta", {
        "type": "message_delta", "delta": {"stop_reason": _stop_reason(result), "stop_sequence": result.stop_sequence},
        "usage": {"output_tokens": output_tokens(engine, result), **_cache_usage(result)},
    }))
    out.append(sse("message_stop", {"type": "message_stop"}))
    return out


async def message_events(
    events: AsyncIterator[TurnEvent], engine: Engine, *, model: str, input_tokens: int
) -> AsyncIterator[bytes]:
    """A turn's events (after ``Prepared``) as Anthropic's stream: ``message_start``, ``ping``,
    the content blocks, ``message_delta`` (stop reason, output tokens), ``message_stop``;
    a failure mid-stream (``Failed``, or a raised error) is an ``error`` event."""
    message: JsonObject = {
        "id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": input_tokens, "output_tokens": 0},
    }
    yield sse("message_start", {"type": "message_start", "message": message})
    yield sse("ping", {"type": "ping"})
    blocks = _Blocks()
    pieces: list[str] = []
    try:
        async for event in events:
            match event.kind:
                case "delta" | "tool_call":
                    if event.kind == "delta":
                        pieces.append(event.text)
                    for chunk in _event_bytes(event, blocks):
                        yield chunk
                case "done":
                    for chunk in _finish(event.result, blocks, engine):
                        yield chunk
                case "failed":
                    yield _error_event(event.error, event.partial_answer)
    except Exception as exc:
        yield _error_event(exc, "".join(pieces))
    finally:
        await events.aclose()  # type: ignore[attr-defined]
