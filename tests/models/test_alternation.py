"""A chat template that demands user/assistant alternation (Mistral's, Gemma's on llama.cpp or
vLLM): the shipped order sends what changes every turn as a user message right before the
user's own, and the model adapter steps down once, to one merged user message, when the server
refuses two in a row."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

pytest.importorskip("openai")

from contextmode.api import build_engine
from contextmode.models import OpenAIChatModel, OpenAIOptions
from contextmode.models.openai import alternating
from contextmode.settings import EngineSettings
from contextmode.store import MemoryStore
from contextmode.testing.counters import CharTokenCounter
from contextmode.testing.stub_server import StubRequest, StubServer
from contextmode.types import ChatMessage, SessionKey

_REFUSAL = "Conversation roles must alternate user/assistant/user/assistant/..."


def _strict_template(request: StubRequest) -> str:
    """Answers like a strict chat template: refuses (the stub's 500 with the template's words)
    a request in which two messages of one role follow each other."""
    roles = [m["role"] for m in request.messages if m["role"] != "system"]
    if any(a == b for a, b in itertools.pairwise(roles)):
        raise ValueError(_REFUSAL)
    return "ok"


def _model(url: str) -> OpenAIChatModel:
    return OpenAIChatModel(model="stub-model", base_url=url, max_retries=0, timeout=5,
                           options=OpenAIOptions(reply_max_tokens=100))


def _roles(request: StubRequest) -> list[str]:
    return [m["role"] for m in request.messages]


async def test_a_refused_run_of_user_messages_is_merged_once_then_always() -> None:
    server = StubServer(_strict_template)
    messages = [ChatMessage(role="system", content="sys"), ChatMessage(role="user", content="hi"),
                ChatMessage(role="assistant", content="hello"), ChatMessage(role="user", content="<recall>…</recall>"),
                ChatMessage(role="user", content="what did I say?")]
    with server as url:
        model = _model(url)
        assert await model.complete(messages) == "ok"
        assert "".join([t async for t in model.stream(messages)]) == "ok"
        await model.aclose()
    sent = server.chat_requests
    # Refused once, then sent merged; the next call is merged from the start.
    assert [_roles(r) for r in sent] == [["system", "user", "assistant", "user", "user"],
                                         ["system", "user", "assistant", "user"],
                                         ["system", "user", "assistant", "user"]]
    assert sent[1].messages[-1]["content"] == "<recall>…</recall>\n\nwhat did I say?"


async def test_a_server_that_takes_consecutive_user_messages_gets_them_apart() -> None:
    server = StubServer(lambda r: "ok")
    messages = [ChatMessage(role="user", content="<recall>…</recall>"), ChatMessage(role="user", content="q")]
    with server as url:
        model = _model(url)
        assert await model.complete(messages) == "ok"
        await model.aclose()
    assert [_roles(r) for r in server.chat_requests] == [["user", "user"]]


async def test_the_cache_first_engine_answers_through_a_strict_template() -> None:
    server = StubServer(_strict_template)
    with server as url:
        engine = build_engine(store=MemoryStore(), model=_model(url), counter=CharTokenCounter(),
                              settings=EngineSettings(context_window=1200, order="cache_first"))
        key = SessionKey("t", "s")
        for i in range(40):
            await engine.turn(key.tenant, key.session_id, f"My dog Rex likes walk number {i} in the park, by the old oak trees near the pond.")
        result = await engine.turn(key.tenant, key.session_id, "What is my dog called?")
        await engine.close()
    assert result.answer == "ok" and not result.partial
    # The cache_first order sent the recalled turns as their own message before the user's...
    tail = [r for r in server.chat_requests if len(r.messages) > 2 and _roles(r)[-2:] == ["user", "user"]]
    assert tail, "nothing was sent after the turns"
    # ... the template refused it once; every request since alternates, the user's words last.
    last = server.chat_requests[-1]
    roles = [r for r in _roles(last) if r != "system"]
    assert all(a != b for a, b in itertools.pairwise(roles))
    assert str(last.messages[-1]["content"]).endswith("What is my dog called?")


def test_alternating_leaves_tool_turns_and_the_system_message_alone() -> None:
    call: dict[str, Any] = {"role": "assistant", "content": None,
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    result: dict[str, Any] = {"role": "tool", "content": "42", "tool_call_id": "c"}
    wire: list[dict[str, Any]] = [{"role": "system", "content": "s"}, {"role": "user", "content": "a"}, call, result,
            {"role": "assistant", "content": "b"}, {"role": "assistant", "content": "c"},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:"}}]},
            {"role": "user", "content": "d"}]
    merged = alternating(wire)
    assert merged[:4] == wire[:4]
    assert merged[4] == {"role": "assistant", "content": "b\n\nc"}
    assert merged[5] == {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:"}},
                                                     {"type": "text", "text": "d"}]}
    assert len(merged) == 6
