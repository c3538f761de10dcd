"""An agent loop with the official openai SDK through the proxy, against a stub model that
calls tools: every request the model receives is valid by OpenAI's pairing rules."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from contextmode.engine.agent import AgentRequest, ToolResult
from contextmode.models.openai import OpenAIChatModel
from contextmode.service import create_app
from contextmode.testing.agents import wire_pairing_errors
from contextmode.testing.counters import CharTokenCounter
from contextmode.testing.stub_server import StubServer, tool_agent_reply
from contextmode.tokens import count_messages
from contextmode.types import ChatMessage, SessionKey, ToolCall
from tests.service.test_service import make_engine, make_settings

TOOLS = [
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}},
]
WINDOW, RESERVE = 1200, 200
"""A small context window (tokens of the tests' counter: a word or a CJK character each); one
big tool result alone is twice the window."""


def _chat_message(wire: dict[str, Any]) -> ChatMessage:
    calls = tuple(ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
                  for c in wire.get("tool_calls") or ())
    return ChatMessage(role=wire["role"], content=wire.get("content") or "", tool_calls=calls,
                       tool_call_id=wire.get("tool_call_id"))


@pytest.fixture
def stub() -> Any:
    server = StubServer(tool_agent_reply(rounds=2, parallel=3))
    with server:
        yield server


@pytest.fixture
async def sdk(stub: StubServer, tmp_path: Path) -> AsyncIterator[Any]:
    model = OpenAIChatModel(model="stub-model", base_url=stub.url, api_key="k", max_retries=0)
    engine = make_engine(model, context_window=WINDOW, reply_reserve=RESERVE)
    app = create_app(engine, make_settings(tmp_path))
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")
    client = openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", http_client=http, max_retries=0)
    yield client
    await client.close()
    await engine.close()


def run_tool(name: str, arguments: str, n: int) -> str:
    args = json.loads(arguments)
    if name == "read_file":  # a big result: far larger than the whole window
        return "\n".join(f"line {i}: log entry about {args['query']}" for i in range(300))
    return f"result {n} for {args['query']}: 3 hits, 最便宜 {100 + n} 元"


async def _completion(sdk: Any, messages: list[dict[str, Any]], stream: bool) -> tuple[str, list[dict[str, Any]]]:
    """One request; the answer's text and tool calls (assembled from deltas when streamed)."""
    kwargs = {"model": "gpt-x", "messages": messages, "tools": TOOLS, "user": "agent-1"}
    if not stream:
        reply = await sdk.chat.completions.create(**kwargs)
        message = reply.choices[0].message
        calls = [{"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
                 for c in message.tool_calls or ()]
        assert reply.choices[0].finish_reason == ("tool_calls" if calls else "stop")
        return message.content or "", calls
    text, calls_by_index, finish = "", {}, None
    async for chunk in await sdk.chat.completions.create(**kwargs, stream=True):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for piece in choice.delta.tool_calls or ():
                call = calls_by_index.setdefault(piece.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                call["id"] = piece.id or call["id"]
                if piece.function and piece.function.name:
                    call["function"]["name"] = piece.function.name
                call["function"]["arguments"] += (piece.function.arguments or "") if piece.function else ""
            finish = choice.finish_reason or finish
    calls = [calls_by_index[i] for i in sorted(calls_by_index)]
    assert finish == ("tool_calls" if calls else "stop")
    return text, calls


@pytest.mark.slow
async def test_agent_loop_through_the_proxy_keeps_every_request_valid(sdk: Any, stub: StubServer) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a travel agent."}]
    questions = ["Find flights to Lisbon.", "帮我查一下酒店。", "Compare both.", "Read the log please."]
    messages.append({"role": "user", "content": questions[0]})
    user_turns, tool_rounds = 1, 0
    latest_user: list[str] = []
    for iteration in range(30):
        latest_user.append(next(m["content"] for m in reversed(messages) if m["role"] == "user"))
        text, calls = await _completion(sdk, messages, stream=iteration % 2 == 1)
        if calls:
            tool_rounds += 1
            messages.append({"role": "assistant", "content": text or None, "tool_calls": calls})
            for n, call in enumerate(calls):  # the client runs the tools and sends their results
                messages.append({"role": "tool", "tool_call_id": call["id"],
                                 "content": run_tool(call["function"]["name"], call["function"]["arguments"], n)})
        else:
            assert text.startswith("Stub answer after 2 tool rounds")
            messages.append({"role": "assistant", "content": text})
            messages.append({"role": "user", "content": questions[user_turns % len(questions)]})
            user_turns += 1
    received = stub.chat_requests
    assert len(received) == 30
    for request in received:
        assert wire_pairing_errors(request.messages) == [], request.messages
        assert request.messages[0]["role"] == "system" and "travel agent" in request.messages[0]["content"]
        assert request.body["tools"] == TOOLS
        # The window is far smaller than the history; what the model gets fits it (exact count).
        assert count_messages(CharTokenCounter(), [_chat_message(m) for m in request.messages]) <= WINDOW - RESERVE
    assert tool_rounds >= 15 and user_turns >= 5
    # The latest user message reaches the model in every request, the current step after it.
    for request, expected in zip(received, latest_user, strict=True):
        users = [i for i, m in enumerate(request.messages) if m["role"] == "user"]
        assert request.messages[users[-1]]["content"] == expected
    # Big results were cut to an excerpt with a marker, not dropped or sent whole.
    assert any("tokens elided" in str(m.get("content")) for r in received for m in r.messages if m["role"] == "tool")


async def test_results_resent_with_the_history_are_stored_once(stub: StubServer, tmp_path: Path) -> None:
    model = OpenAIChatModel(model="stub-model", base_url=stub.url, api_key="k", max_retries=0)
    engine = make_engine(model)
    first = [e async for e in engine.stream_agent(SessionKey("t", "s"), AgentRequest(message="find it", tools=TOOLS))]
    calls = first[-1].result.tool_calls  # type: ignore[union-attr]
    assert len(calls) == 3 and all(c.id for c in calls)
    results = tuple(ToolResult(call_id=c.id, content=f"found {c.id}") for c in calls)
    for _ in range(2):  # a client retrying with the same results
        [e async for e in engine.stream_agent(SessionKey("t", "s"), AgentRequest(tool_results=results, tools=TOOLS))]
    turns = await engine.store.turns(SessionKey("t", "s"))
    assert [t.role for t in turns].count("tool") == 3
    assert turns[1].tool_calls == calls and turns[2].tool_name in {"search", "read_file"}
    await engine.close()


async def test_tool_message_without_call_id_is_a_clear_error(sdk: Any) -> None:
    with pytest.raises(openai.BadRequestError, match="tool_call_id"):
        await sdk.chat.completions.create(
            model="m", user="x", messages=[{"role": "user", "content": "hi"}, {"role": "tool", "content": "r"}],
        )


async def test_http_api_and_cli_show_tool_items(stub: StubServer, tmp_path: Path) -> None:
    from rich.console import Console

    from contextmode.cli.render import turns_table

    model = OpenAIChatModel(model="stub-model", base_url=stub.url, api_key="k", max_retries=0)
    engine = make_engine(model)
    app = create_app(engine, make_settings(tmp_path))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        body = {"model": "m", "user": "a1", "tools": TOOLS, "messages": [{"role": "user", "content": "find flights"}]}
        reply = (await http.post("/v1/chat/completions", json=body)).json()
        calls = reply["choices"][0]["message"]["tool_calls"]
        body["messages"] += [reply["choices"][0]["message"],
                             *({"role": "tool", "tool_call_id": c["id"], "content": f"hit {c['id']}"} for c in calls)]
        await http.post("/v1/chat/completions", json=body)
        body["messages"] += [{"role": "user", "content": "just answer"}]
        forced = (await http.post("/v1/chat/completions", json={**body, "tool_choice": "none"})).json()
        assert stub.chat_requests[-1].body["tool_choice"] == "none"
        assert forced["choices"][0]["finish_reason"] == "stop" and "tool_calls" not in forced["choices"][0]["message"]
        session = (await http.get("/v1/sessions/a1")).json()["data"]
        context = (await http.get("/v1/sessions/a1/context", params={"message": "and hotels?"})).json()["data"]
    turns = session["turns"]
    assert [c["name"] for c in turns[1]["tool_calls"]] == [c["function"]["name"] for c in calls]
    assert turns[2]["role"] == "tool" and turns[2]["tool_call_id"] == calls[0]["id"]
    sent = context["messages"]
    assert [m["role"] for m in sent[1:5]] == ["user", "assistant", "tool", "tool"]
    assert sent[2]["tool_calls"][0]["id"] == calls[0]["id"]
    console = Console(record=True, width=200)
    console.print(turns_table(await engine.store.turns(SessionKey("t", "a1")) or await engine.store.turns(SessionKey("local", "a1"))))
    text = console.export_text()
    assert "Called search(query “find flights”, part 0)" in text and "returned: hit" in text
    await engine.close()
