"""The Anthropic-compatible memory proxy (``POST /v1/messages``) with the official anthropic SDK:
over real HTTP (uvicorn, the OpenAI-protocol stub server as the upstream model) and in process."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import pytest

from contextmode.api import build_engine
from contextmode.errors import ModelError
from contextmode.models.openai import OpenAIChatModel
from contextmode.service import create_app
from contextmode.settings import EngineSettings
from contextmode.testing.counters import CharTokenCounter
from contextmode.testing.models import BrokenStream, FunctionModel, ScriptedModel
from contextmode.testing.stub_server import StubRequest, StubServer, tool_agent_reply
from contextmode.tokens import count_messages
from contextmode.types import SessionKey
from tests.service.test_service import make_engine, make_settings, sse_events
from tests.service.test_service_http import serving

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40).decode()
TOOLS = [
    {"name": "search", "description": "Search the web.", "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}}},
    {"name": "read_file", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}},
]


def remembering(request: StubRequest) -> str:
    seen = " | ".join(str(m.get("content")) for m in request.messages)
    return "名字是小明" if "我叫小明" in seen and "我叫什么" in request.last_user else "好的"


@pytest.fixture
def stub() -> Iterator[StubServer]:
    server = StubServer(remembering, chunk_chars=2)
    with server:
        yield server


def _app(model: Any, tmp_path: Path, **settings: Any) -> Any:
    return create_app(make_engine(model), make_settings(tmp_path, **settings))


@pytest.fixture
def model() -> FunctionModel:
    return FunctionModel(lambda messages: ["答：", messages[-1].content[:8]])


@pytest.fixture
def app(model: FunctionModel, tmp_path: Path) -> Any:
    return _app(model, tmp_path)


@pytest.fixture
async def sdk(app: Any) -> AsyncIterator[anthropic.AsyncAnthropic]:
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://test")
    client = anthropic.AsyncAnthropic(base_url="http://test", api_key="unused", http_client=http, max_retries=0)
    yield client
    await client.close()


def test_sync_client_over_http_keeps_memory_between_calls(stub: StubServer, tmp_path: Path) -> None:
    upstream = OpenAIChatModel(model="stub-model", base_url=stub.url, api_key="upstream-secret", max_retries=0)
    with serving(_app(upstream, tmp_path, api_keys={"app-key": "appTenant"})) as base:
        client = anthropic.Anthropic(base_url=base, api_key="app-key", max_retries=0)
        first = client.messages.create(
            model="claude-x", max_tokens=256, system="你是一个简洁的助手",
            messages=[{"role": "user", "content": "我叫小明"}], metadata={"user_id": "chat-1"},
        )
        assert (first.type, first.role, first.model, first.stop_reason) == ("message", "assistant", "claude-x", "end_turn")
        assert [b.type for b in first.content] == ["text"] and first.content[0].text == "好的"
        assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0
        sent = stub.chat_requests[-1].messages
        assert sent[0]["role"] == "system" and "你是一个简洁的助手" in sent[0]["content"]
        # The app sends only its new message, naming the session by header: memory supplies the rest.
        second = client.messages.create(
            model="claude-x", max_tokens=256, messages=[{"role": "user", "content": "我叫什么?"}],
            extra_headers={"X-Session-Id": "chat-1"},
        )
        assert second.content[0].text == "名字是小明"
        assert "你是一个简洁的助手" not in stub.chat_requests[-1].messages[0]["content"]  # per request
        with pytest.raises(anthropic.AuthenticationError) as info:
            anthropic.Anthropic(base_url=base, api_key="wrong", max_retries=0).messages.create(
                model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}], metadata={"user_id": "s"}
            )
        assert info.value.body["error"]["type"] == "authentication_error"


async def test_streaming_over_http_gives_the_sdks_events(stub: StubServer, tmp_path: Path) -> None:
    upstream = OpenAIChatModel(model="stub-model", base_url=stub.url, api_key="k", max_retries=0)
    with serving(_app(upstream, tmp_path)) as base:
        client = anthropic.AsyncAnthropic(base_url=base, api_key="k", max_retries=0)
        await client.messages.create(model="m", max_tokens=64, messages=[{"role": "user", "content": "我叫小明"}],
                                     metadata={"user_id": "s-stream"})
        async with client.messages.stream(
            model="m", max_tokens=64, messages=[{"role": "user", "content": "我叫什么?"}], metadata={"user_id": "s-stream"}
        ) as stream:
            kinds = [event.type async for event in stream]
            final = await stream.get_final_message()
        assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
        assert kinds[-2] == "message_delta" and "content_block_stop" in kinds
        assert final.content[0].text == "名字是小明" and final.stop_reason == "end_turn"
        assert final.usage.input_tokens > 0 and final.usage.output_tokens > 0
        # On the wire: named events, a ping after message_start, one text block, no [DONE].
        async with httpx.AsyncClient(base_url=base) as raw:
            r = await raw.post("/v1/messages", headers={"X-Session-Id": "s-stream"},
                               json={"model": "m", "max_tokens": 64, "stream": True,
                                     "messages": [{"role": "user", "content": "再说一次"}]})
        names = [line[len("event: "):] for line in r.text.splitlines() if line.startswith("event: ")]
        assert names[:3] == ["message_start", "ping", "content_block_start"]
        assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
        assert "[DONE]" not in r.text and r.headers["x-session-id"] == "s-stream"


async def test_tool_use_round_trip_whole_and_streamed(tmp_path: Path) -> None:
    server = StubServer(tool_agent_reply(rounds=1, parallel=2))
    with server:
        upstream = OpenAIChatModel(model="stub-model", base_url=server.url, api_key="k", max_retries=0)
        app = _app(upstream, tmp_path)
        http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://test")
        client = anthropic.AsyncAnthropic(base_url="http://test", api_key="k", http_client=http, max_retries=0)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Find flights to Lisbon."}]
        reply = await client.messages.create(model="m", max_tokens=64, tools=TOOLS, messages=messages,  # type: ignore[arg-type]
                                             metadata={"user_id": "agent-1"})
        assert reply.stop_reason == "tool_use"
        uses = [b for b in reply.content if b.type == "tool_use"]
        assert [(u.name, u.input) for u in uses] == [
            ("search", {"query": "Find flights to Lisbon.", "part": 0}),
            ("read_file", {"query": "Find flights to Lisbon.", "part": 1}),
        ]
        offered = server.chat_requests[-1].body["tools"]
        assert offered[0] == {"type": "function", "function": {"name": "search", "description": "Search the web.",
                                                               "parameters": TOOLS[0]["input_schema"]}}
        messages += [
            {"role": "assistant", "content": [u.model_dump() for u in uses]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": u.id, "content": f"result {n}"}
                                         for n, u in enumerate(uses)]},
        ]
        done = await client.messages.create(model="m", max_tokens=64, tools=TOOLS, messages=messages,  # type: ignore[arg-type]
                                            metadata={"user_id": "agent-1"})
        assert done.stop_reason == "end_turn" and done.content[0].text.startswith("Stub answer after 1 tool rounds")
        upstream_messages = server.chat_requests[-1].messages
        assert [m["role"] for m in upstream_messages[-4:]] == ["user", "assistant", "tool", "tool"]
        assert [m["content"] for m in upstream_messages[-2:]] == ["result 0", "result 1"]
        # Streamed: tool_use blocks built from input_json_delta events by the SDK itself.
        async with client.messages.stream(model="m", max_tokens=64, tools=TOOLS,  # type: ignore[arg-type]
                                          messages=[{"role": "user", "content": "Now hotels."}],
                                          metadata={"user_id": "agent-1"}) as stream:
            kinds = [event.type async for event in stream]
            final = await stream.get_final_message()
        assert final.stop_reason == "tool_use"
        assert [(b.type, b.input) for b in final.content] == [
            ("tool_use", {"query": "Now hotels.", "part": 0}), ("tool_use", {"query": "Now hotels.", "part": 1})
        ]
        assert kinds.count("content_block_start") == 2 and kinds.count("content_block_stop") == 2
        await client.close()
        await app.state.contextmode.engine.close()


async def test_system_blocks_images_and_the_stored_turn(app: Any, sdk: anthropic.AsyncAnthropic, model: FunctionModel,
                                                         tmp_path: Path) -> None:
    reply = await sdk.messages.create(
        model="m", max_tokens=32, system=[{"type": "text", "text": "只用英文回答"}],
        messages=[
            {"role": "user", "content": "旧的"},
            {"role": "assistant", "content": [{"type": "text", "text": "client copy"}]},
            {"role": "user", "content": [{"type": "text", "text": "看图"},
                                         {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}]},
        ],
        extra_headers={"X-Session-Id": "img"},
    )
    assert reply.content[0].text == "答：看图"
    assert "只用英文回答" in model.calls[-1].system
    turns = await app.state.contextmode.engine.store.turns(SessionKey("local", "img"))
    assert [(t.role, t.content) for t in turns] == [  # a new session adopts the client's history
        ("user", "旧的"), ("assistant", "client copy"), ("user", "看图"), ("assistant", "答：看图")]
    assert turns[2].metadata["image_count"] == 1
    assert list((tmp_path / "images").iterdir()) == []
    with pytest.raises(anthropic.BadRequestError) as info:
        await sdk.messages.create(model="m", max_tokens=8, extra_headers={"X-Session-Id": "img"}, messages=[
            {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
                                         {"type": "text", "text": "?"}]}])
    assert info.value.body["error"]["code"] == "bad_image"


async def test_errors_have_anthropics_shape(sdk: anthropic.AsyncAnthropic) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"messages": [{"role": "user", "content": "no session"}]}, "X-Session-Id"),
        ({"messages": [], "metadata": {"user_id": "s"}}, "messages"),
        ({"messages": [{"role": "user", "content": "x"}], "metadata": {"user_id": "名" * 30}}, "invalid session id"),
        ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "Sure,"}],
          "metadata": {"user_id": "s"}}, "prefilled"),
        ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}], "metadata": {"user_id": "s"}},
         "document"),
    ]
    for extra, needle in cases:
        with pytest.raises(anthropic.BadRequestError) as info:
            await sdk.messages.create(model="m", max_tokens=8, **extra)
        body = info.value.body
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
        assert needle in body["error"]["message"], body


async def test_model_errors_before_and_during_the_stream(tmp_path: Path) -> None:
    engine = make_engine(ScriptedModel([ModelError("boom"), BrokenStream(chunks=["半句"])]))
    app = create_app(engine, make_settings(tmp_path))
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://test")
    sdk = anthropic.AsyncAnthropic(base_url="http://test", api_key="k", http_client=http, max_retries=0)
    with pytest.raises(anthropic.InternalServerError) as info:
        await sdk.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "a"}],
                                  metadata={"user_id": "e"})
    assert info.value.status_code == 502 and info.value.body["error"]["type"] == "api_error"
    got: list[str] = []
    with pytest.raises(anthropic.APIStatusError) as info:
        async with sdk.messages.stream(model="m", max_tokens=8, messages=[{"role": "user", "content": "b"}],
                                       metadata={"user_id": "e"}) as stream:
            async for text in stream.text_stream:
                got.append(text)
    assert "".join(got) == "半句"
    assert info.value.body["error"]["contextmode_data"]["partial_answer"] == "半句"
    turns = await engine.store.turns(SessionKey("local", "e"))
    assert [(t.content, t.partial) for t in turns] == [("a", False), ("b", False), ("半句", True)]
    await sdk.close()


async def test_streams_are_counted_in_the_metrics_chat_turns_and_agent_steps(tmp_path: Path) -> None:
    engine = make_engine(ScriptedModel(["好的", BrokenStream(chunks=["半句"]), "工具答", BrokenStream(chunks=["断"])]))
    app = create_app(engine, make_settings(tmp_path))
    body = {"model": "m", "max_tokens": 8, "stream": True}
    headers = {"X-Session-Id": "counted"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
        ends: list[tuple[str, str]] = []
        for content, tools in (("a", None), ("b", None), ("c", TOOLS), ("d", TOOLS)):
            step = {**body, "messages": [{"role": "user", "content": content}], **({"tools": tools} if tools else {})}
            events = sse_events((await c.post("/v1/messages", json=step, headers=headers)).text)
            last = events[-1]
            ends.append((last["type"], last.get("error", {}).get("contextmode_data", {}).get("partial_answer", "")))
        await engine.drain()
        text = (await c.get("/metrics")).text
    assert ends == [("message_stop", ""), ("error", "半句"), ("message_stop", ""), ("error", "断")]
    assert 'contextmode_turns_total{mode="contextual",outcome="ok"} 2.0' in text
    assert 'contextmode_turns_total{mode="contextual",outcome="error"} 2.0' in text
    assert "contextmode_active_streams 0.0" in text
    turns = await engine.store.turns(SessionKey("local", "counted"))
    assert [(t.content, t.partial) for t in turns if t.role == "assistant"] == [
        ("好的", False), ("半句", True), ("工具答", False), ("断", True)
    ]


async def test_idempotency_key_replays_the_first_answer(app: Any, model: FunctionModel) -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
        body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "只算一次"}]}
        headers = {"X-Session-Id": "idem", "Idempotency-Key": "k-1"}
        first = await c.post("/v1/messages", json=body, headers=headers)
        again = await c.post("/v1/messages", json=body, headers=headers)
        assert again.json() == first.json() and again.headers["idempotent-replayed"] == "true"
        assert len(model.calls) == 1
        stream = await c.post("/v1/messages", json={**body, "stream": True}, headers={**headers, "Idempotency-Key": "k-2"})
        replay = await c.post("/v1/messages", json={**body, "stream": True}, headers={**headers, "Idempotency-Key": "k-2"})
        assert sse_events(replay.text) == sse_events(stream.text)
        assert json.loads(stream.text.split("data: ")[1].split("\n")[0])["type"] == "message_start"
        reused = await c.post("/v1/messages", json={**body, "messages": [{"role": "user", "content": "别的"}]},
                              headers=headers)
        assert reused.status_code == 409 and reused.json()["error"]["code"] == "idempotency_key_reused"
        # An agent step (tools offered) is kept and replayed the same way.
        step = {**body, "tools": TOOLS, "messages": [{"role": "user", "content": "用工具"}]}
        calls = len(model.calls)
        first = await c.post("/v1/messages", json=step, headers={**headers, "Idempotency-Key": "k-3"})
        again = await c.post("/v1/messages", json=step, headers={**headers, "Idempotency-Key": "k-3"})
        assert first.status_code == 200 and again.json() == first.json()
        assert again.headers["idempotent-replayed"] == "true" and len(model.calls) == calls + 1


async def test_thirty_turns_reach_the_model_as_summary_pins_and_recall_within_budget(tmp_path: Path) -> None:
    window, reserve = 900, 200
    model = FunctionModel(lambda messages: ["Answer to: ", messages[-1].content[:40]])
    engine = build_engine(store="memory://", model=model, counter=CharTokenCounter(),
                          settings=EngineSettings(context_window=window, reply_reserve=reserve))
    app = create_app(engine, make_settings(tmp_path))
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://test")
    sdk = anthropic.AsyncAnthropic(base_url="http://test", api_key="k", http_client=http, max_retries=0)
    said = ["我不吃辣，预算五十以内", "My locker code at the gym is 4417, please remember it."]
    said += [f"How many minutes are in {n + 2} hours, and how many seconds?" for n in range(27)]
    said.append("What was my locker code at the gym?")
    for n, text in enumerate(said):
        kwargs: dict[str, Any] = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": text}],
                                  "metadata": {"user_id": "long"}}
        if n % 2:
            async with sdk.messages.stream(**kwargs) as stream:
                await stream.get_final_message()
        else:
            await sdk.messages.create(**kwargs)
        await engine.drain()  # summaries and pins of this turn, before the next
    assert len(model.calls) == 30
    last = model.calls[-1].messages
    system = last[0].content
    assert "<summary>" in system  # the early turns, summarised
    assert "不吃辣" in system  # pinned
    assert "4417" in system  # recalled from turn 2, long out of the recent window
    assert last[-1].content.endswith("What was my locker code at the gym?")
    for call in model.calls:
        assert count_messages(CharTokenCounter(), call.messages) <= window - reserve
    await sdk.close()
    await engine.close()


async def test_count_tokens_is_the_context_a_turn_would_send(
    sdk: anthropic.AsyncAnthropic, model: FunctionModel, app: Any
) -> None:
    await sdk.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "我不吃辣，预算五十以内"}],
                              metadata={"user_id": "count"})
    # Its pins are a background job: let it end, so the count and the turn see the same session.
    await app.state.contextmode.engine.drain()
    counted = await sdk.messages.count_tokens(model="m", messages=[{"role": "user", "content": "推荐一家餐厅"}],
                                              extra_headers={"X-Session-Id": "count"})
    fresh = await sdk.messages.count_tokens(model="m", messages=[{"role": "user", "content": "推荐一家餐厅"}],
                                            extra_headers={"X-Session-Id": "empty"})
    assert counted.input_tokens > fresh.input_tokens > 0  # the session's memory is in the count
    calls = len(model.calls)
    reply = await sdk.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "推荐一家餐厅"}],
                                      metadata={"user_id": "count"})
    assert len(model.calls) == calls + 1  # counting called no model and stored nothing
    assert reply.usage.input_tokens == counted.input_tokens
