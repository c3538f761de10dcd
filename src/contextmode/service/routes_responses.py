"""``POST /v1/responses``: OpenAI's Responses API with context-mode's memory (what the OpenAI
Agents SDK's default model, ``OpenAIResponsesModel``, calls).

The request is read as the chat-completions proxy reads its own (`routes_openai`):
``instructions`` and ``system`` / ``developer`` items are the system prompt, the last user
item is the new message (``input_text`` and ``input_image`` parts), earlier items the app's
history (adopted on a session not seen yet), trailing ``function_call_output`` items the
results of the model's calls (an agent step). The model endpoint speaks chat completions:
the request's fields are relayed in their chat names (`chat_fields`). The answer is a
``response`` object (``message`` and ``function_call`` output items, ``usage``, ``status``
``incomplete`` when the length cap cut it), or with ``stream`` its events:
``response.created``, ``response.output_item.added``, ``response.content_part.added``,
``response.output_text.delta`` …, ``response.function_call_arguments.delta`` …, the
``.done`` events, then ``response.completed``. Errors take OpenAI's shape.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Literal, TypedDict

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool

from ..engine import TurnEvent, TurnRequest, TurnResult, UseDefault
from ..errors import InputError
from ..models.base import Relay
from ..types import JsonObject, JsonValue, SessionKey
from .codes import code_for_exception, public_message
from .idempotency import IdempotencyKey, SessionHeader
from .openai_tools import agent_request
from .proxy import (
    HistoryHeader,
    ProxyChat,
    ReplyShape,
    accepted_first,
    chat_turn,
    mapped_id,
    system_prompt,
)
from .routes_openai import ProxyMessage, client_history, system_texts, text_and_images
from .schemas import WireObject
from .sse import sse_event
from .state import AppState, Tenant, app_state
from .turns import StartedStream, Streamed, Whole, check_message, serve_once, step_runners

__all__ = ["ResponsesRequest", "chat_fields", "router"]

router = APIRouter(tags=["openai-compatible"])
State = Annotated[AppState, Depends(app_state)]
PATH = "/v1/responses"


class ResponsesRequest(BaseModel):
    """The fields of the Responses API the proxy reads; the others are relayed (`chat_fields`)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    input: str | list[WireObject] = Field(description="The new message, or items (messages, calls, outputs).")
    instructions: str | None = Field(default=None, description="The system prompt (with the memory notice).")
    stream: StrictBool = False
    user: str | None = Field(default=None, description="The end user, and the session when no X-Session-Id.")
    tools: list[WireObject] | None = Field(default=None, description="Function tools.")
    tool_choice: str | WireObject | None = None


_RELAYED = ("temperature", "top_p", "parallel_tool_calls", "metadata", "user", "prompt_cache_key",
            "service_tier", "top_logprobs", "safety_identifier")
"""Responses fields with the same name and meaning in chat completions."""


def chat_fields(body: ResponsesRequest, tools: list[JsonObject] | None, choice: str | JsonObject | None) -> JsonObject:
    """The request's fields in chat-completions names: those of `_RELAYED` as sent, unknown
    (``extra_body``) fields as sent, ``max_output_tokens`` → ``max_tokens``, ``text.format`` →
    ``response_format``, ``reasoning.effort`` → ``reasoning_effort``, the tools converted.
    Responses-only fields (``previous_response_id``, ``include``, ``truncation``, ``store``,
    ``background``, ``conversation``, ``prompt``…) are not sent."""
    sent: JsonObject = body.model_dump(exclude_unset=True)
    known = set(ResponsesRequest.model_fields) | {
        "max_output_tokens", "text", "reasoning", "previous_response_id", "include", "truncation", "store",
        "background", "conversation", "prompt", "max_tool_calls", "stream_options",
    }
    fields = {k: v for k, v in sent.items() if k in _RELAYED or k not in known}
    if isinstance(sent.get("max_output_tokens"), int):
        fields["max_tokens"] = sent["max_output_tokens"]
    text = sent.get("text")
    form = text.get("format") if isinstance(text, dict) else None
    if isinstance(form, dict) and form.get("type") == "json_schema":
        schema: JsonObject = {k: form[k] for k in ("name", "schema", "strict", "description") if k in form}
        fields["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif isinstance(form, dict) and form.get("type") == "json_object":
        fields["response_format"] = {"type": "json_object"}
    reasoning = sent.get("reasoning")
    effort = reasoning.get("effort") if isinstance(reasoning, dict) else None
    if isinstance(effort, str):
        fields["reasoning_effort"] = effort
    if tools:
        fields["tools"] = [*tools]  # list is invariant: the same objects, as JSON values
    if choice is not None:
        fields["tool_choice"] = choice
    return fields


def _chat_tools(tools: Sequence[Mapping[str, JsonValue]] | None) -> list[JsonObject] | None:
    if not tools:
        return None
    out: list[JsonObject] = []
    for tool in tools:
        if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            raise InputError(f"only function tools are served (got {tool.get('type')!r})")
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
        out.append({"type": "function", "function": function})
    return out


def _chat_tool_choice(choice: str | Mapping[str, JsonValue] | None) -> str | JsonObject | None:
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise InputError("tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...}")


def _parts(content: JsonValue) -> str | list[WireObject]:
    """A Responses message's content as chat content (``input_text`` / ``output_text`` → text,
    ``input_image`` → ``image_url``)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InputError("an input message's content must be a string or a list of parts")
    parts: list[WireObject] = []
    for item in content:
        part = item if isinstance(item, dict) else {}  # not an object: no type, refused below
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": str(part.get("text", ""))})
        elif kind == "input_image":
            parts.append({"type": "image_url", "image_url": {"url": str(part.get("image_url") or "")}})
        elif kind != "refusal":
            raise InputError(f"unsupported input part type {kind!r} (input_text and input_image are)")
    return parts


def chat_messages(body: ResponsesRequest) -> list[ProxyMessage]:
    """``instructions`` and ``input`` as chat messages (consecutive ``function_call`` items are
    one assistant message with its calls; ``reasoning`` items are skipped)."""
    messages: list[ProxyMessage] = []
    if body.instructions:
        messages.append(ProxyMessage(role="system", content=body.instructions))
    if isinstance(body.input, str):
        return [*messages, ProxyMessage(role="user", content=body.input)]
    for item in body.input:
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise InputError(f"unsupported message role {role!r}")
            messages.append(ProxyMessage(role=str(role), content=_parts(item.get("content"))))
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"}}
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant" and last.tool_calls and not last.content:
                last.tool_calls.append(call)
            else:
                messages.append(ProxyMessage(role="assistant", content=None, tool_calls=[call]))
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
            # validated as the request's own messages are (an id that is not a string is refused)
            messages.append(ProxyMessage.model_validate({"role": "tool", "content": text, "tool_call_id": item.get("call_id")}))
        elif kind != "reasoning":
            raise InputError(f"unsupported input item type {kind!r}")
    if not messages or messages[-1].role in ("system", "developer"):
        raise InputError("input must end with a user message or function call outputs")
    return messages


def _usage(result: TurnResult) -> JsonObject:
    usage = result.usage or {}
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens")
    inp = prompt if isinstance(prompt, int) else result.prepared.context.total_tokens
    out = completion if isinstance(completion, int) else (result.assistant_turn.tokens if result.assistant_turn else 0)
    return {"input_tokens": inp, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": out,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": inp + out}


class _OutputText(TypedDict):
    type: Literal["output_text"]
    text: str
    annotations: list[JsonValue]


class _MessageItem(TypedDict):
    """The answer's text, an output item of the response."""

    type: Literal["message"]
    id: str
    status: Literal["in_progress", "completed"]
    role: Literal["assistant"]
    content: list[_OutputText]


class _CallItem(TypedDict):
    """One tool call of the answer, an output item of the response."""

    type: Literal["function_call"]
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["completed"]


_OutputItem = _MessageItem | _CallItem


@dataclass
class _Reply:
    """One response being written: its id, and its output items as they are made."""

    model: str
    id: str = field(default_factory=lambda: f"resp_{uuid.uuid4().hex}")
    created: int = field(default_factory=lambda: int(time.time()))
    seq: int = 0

    def body(self, result: TurnResult | None, output: Sequence[_OutputItem]) -> dict[str, object]:
        cut = result is not None and result.finish_reason == "length"
        status = "in_progress" if result is None else "incomplete" if cut else "completed"
        return {
            "id": self.id, "object": "response", "created_at": self.created, "status": status, "model": self.model,
            "output": output, "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "usage": _usage(result) if result is not None else None,
        }

    def event(self, kind: str, payload: Mapping[str, object]) -> bytes:
        self.seq += 1
        return sse_event({"type": kind, "sequence_number": self.seq, **payload})


def _output(result: TurnResult) -> list[_OutputItem]:
    items: list[_OutputItem] = []
    if result.answer or not result.tool_calls:
        items.append({"type": "message", "id": f"msg_{uuid.uuid4().hex}", "status": "completed", "role": "assistant",
                      "content": [{"type": "output_text", "text": result.answer, "annotations": []}]})
    items.extend(_CallItem(type="function_call", id=f"fc_{uuid.uuid4().hex}", call_id=c.id, name=c.name,
                           arguments=c.arguments, status="completed") for c in result.tool_calls)
    return items


def _json(result: TurnResult, model: str, headers: dict[str, str]) -> Response:
    reply = _Reply(model=model)
    return JSONResponse(reply.body(result, _output(result)), headers=headers)


async def _events(events: AsyncIterator[TurnEvent], model: str) -> AsyncIterator[bytes]:
    """The turn's events as the Responses API's stream: text and call items as they arrive,
    then ``response.completed`` with the whole response (or ``error`` on a failure)."""
    reply = _Reply(model=model)
    yield reply.event("response.created", {"response": reply.body(None, [])})
    text_item: _MessageItem | None = None
    index = 0
    try:
        async for event in events:
            if event.kind == "delta":
                if text_item is None:
                    text_item = {"type": "message", "id": f"msg_{uuid.uuid4().hex}", "status": "in_progress",
                                 "role": "assistant", "content": []}
                    yield reply.event("response.output_item.added", {"output_index": index, "item": text_item})
                    yield reply.event("response.content_part.added", {
                        "item_id": text_item["id"], "output_index": index, "content_index": 0,
                        "part": {"type": "output_text", "text": "", "annotations": []}})
                yield reply.event("response.output_text.delta", {
                    "item_id": text_item["id"], "output_index": index, "content_index": 0, "delta": event.text,
                    "logprobs": []})
            elif event.kind == "done":
                for chunk in _finish(reply, event.result, text_item):
                    yield chunk
            elif event.kind == "failed":
                yield _error(reply, event.error)
    except Exception as exc:
        yield _error(reply, exc)
    finally:
        await events.aclose()  # type: ignore[attr-defined]


def _finish(reply: _Reply, result: TurnResult, text_item: _MessageItem | None) -> list[bytes]:
    """The ``.done`` events of every output item, then ``response.completed``."""
    output = _output(result)
    first = output[0] if output else None
    if text_item is not None and first is not None and first["type"] == "message":
        first["id"] = text_item["id"]
    out: list[bytes] = []
    for index, item in enumerate(output):
        if item["type"] == "message":
            part = item["content"][0]
            if text_item is None:
                out.append(reply.event("response.output_item.added", {"output_index": index, "item": item}))
            out.append(reply.event("response.output_text.done", {
                "item_id": item["id"], "output_index": index, "content_index": 0, "text": part["text"], "logprobs": []}))
            out.append(reply.event("response.content_part.done", {
                "item_id": item["id"], "output_index": index, "content_index": 0, "part": part}))
        else:
            out.append(reply.event("response.output_item.added", {"output_index": index, "item": item}))
            out.append(reply.event("response.function_call_arguments.delta", {
                "item_id": item["id"], "output_index": index, "delta": item["arguments"]}))
            out.append(reply.event("response.function_call_arguments.done", {
                "item_id": item["id"], "output_index": index, "arguments": item["arguments"]}))
        out.append(reply.event("response.output_item.done", {"output_index": index, "item": item}))
    kind = "response.incomplete" if result.finish_reason == "length" else "response.completed"
    out.append(reply.event(kind, {"response": reply.body(result, output)}))
    return out


def _error(reply: _Reply, exc: BaseException) -> bytes:
    row = code_for_exception(exc)
    return reply.event("error", {"code": row.name, "message": public_message(exc, row), "param": None})


@router.post(
    PATH,
    summary="OpenAI Responses API with context-mode's memory",
    responses={200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}}},
)
async def create_response(
    body: ResponsesRequest,
    tenant: Tenant,
    state: State,
    x_session_id: SessionHeader = None,
    idempotency_key: IdempotencyKey = None,
    history: HistoryHeader = None,
) -> Any:
    raw_session = x_session_id or body.user
    if not raw_session:
        raise InputError("name the session: header 'X-Session-Id' or the 'user' field")
    key = SessionKey(tenant, mapped_id(raw_session))
    engine = state.engine
    messages = chat_messages(body)
    tools, choice = _chat_tools(body.tools), _chat_tool_choice(body.tool_choice)
    relay = Relay(fields=chat_fields(body, tools, choice), stream=body.stream)
    system = system_prompt(system_texts(messages), engine.settings.locale)
    model = body.model or engine.model.name
    headers = {"x-session-id": key.session_id}
    step = agent_request(messages, tools, choice)
    if step is not None:
        mode = engine.settings.mode
        agent = replace(step, relay=relay, retry_window_s=state.settings.retry_window_s)
        whole, streamed = step_runners(
            lambda: accepted_first(engine, engine.stream_agent(key, agent, mode=mode, system_prompt=system),
                                   relay, headers),
            mode, state.metrics,
            json=lambda result: _json(result, model, headers),
            body=lambda _started, events: _events(events, model),
        )
    else:
        answering = _Answering(relay=relay, system=system, model=model, headers=headers)
        whole, streamed = _chat(body, messages, key, answering, state, (history, idempotency_key))
    return await serve_once(state, key, idempotency_key, "responses", body.model_dump_json(),
                            whole=None if body.stream else whole, streamed=streamed, headers=headers)


@dataclass(frozen=True, kw_only=True)
class _Answering:
    """How a plain chat turn of this route is sent and answered."""

    relay: Relay
    system: str | UseDefault | None
    model: str
    headers: dict[str, str]


def _chat(
    body: ResponsesRequest, messages: list[ProxyMessage], key: SessionKey, answering: _Answering,
    state: AppState, options: tuple[Literal["adopt", "ignore"] | None, str | None],
) -> tuple[Whole, Streamed]:
    """A plain chat turn (no tools, no call outputs): the last user message, with memory;
    ``options``: the ``X-Context-History`` and ``Idempotency-Key`` headers."""
    history, idempotency_key = options
    relay, system, model, headers = answering.relay, answering.system, answering.model, answering.headers
    last_user = next((m for m in reversed(messages) if m.role == "user"), None)
    if last_user is None:
        raise InputError("input must contain a user message")
    message, image_urls = text_and_images(last_user.content)
    if not message.strip():
        raise InputError("the last user message has no text")
    check_message(message, state.settings)
    user_id = mapped_id(body.user, "user id") if body.user else None
    request = TurnRequest(key=key, message=message, mode=state.engine.settings.mode, system_prompt=system,
                          user_id=user_id, idempotency_key=idempotency_key, relay=replace(relay, images=tuple(image_urls)),
                          retry_window_s=state.settings.retry_window_s)

    def stream(_started: StartedStream, events: AsyncIterator[TurnEvent]) -> AsyncIterator[bytes]:
        return _events(events, model)

    shape = ReplyShape(path=PATH, json=lambda result: _json(result, model, headers), sse=stream, headers=headers)
    earlier = [] if history == "ignore" else client_history(messages)
    return chat_turn(ProxyChat(request=request, image_urls=image_urls, history=earlier), state, shape)
