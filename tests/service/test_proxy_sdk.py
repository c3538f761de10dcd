"""The OpenAI-compatible proxy as a drop-in: an app on the official openai SDK, pointed at the
service, whose model is the stub server recording what it receives. Every request field the
proxy does not own reaches the model; the answer is the model's own; errors keep their status;
retries store one turn; an app's history is adopted; side calls store nothing."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from pydantic import BaseModel

from contextmode.testing.stub_server import StubRequest, StubServer
from contextmode.types import SessionKey
from tests.service.test_service_http import PNG_URL


class Order(BaseModel):
    number: int
    item: str


def reply(request: StubRequest) -> str:
    """JSON for a request asking for it, else an answer naming the last user message."""
    body = request.body if isinstance(request.body, dict) else {}
    if isinstance(body.get("response_format"), dict):
        return json.dumps({"number": 7731, "item": "茶壶"}, ensure_ascii=False)
    return f"Answer to: {request.last_user} END and a long tail after the stop sequence"


@pytest.fixture
async def http(proxy_app: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=proxy_app), base_url="http://test") as client:
        yield client


@pytest.fixture
def sdk(http: httpx.AsyncClient) -> openai.AsyncOpenAI:
    """The SDK as an app uses it: its default retries (2) on."""
    return openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", http_client=http)


async def _turns(engine: Any, session: str) -> list[tuple[str, str]]:
    return [(t.role, t.content) for t in await engine.store.turns(SessionKey("local", session))]


async def test_request_fields_reach_the_model_unchanged(sdk: openai.AsyncOpenAI, stub: StubServer) -> None:
    fields: dict[str, Any] = {
        "temperature": 0.3, "top_p": 0.9, "seed": 7, "presence_penalty": 0.1, "frequency_penalty": 0.2,
        "logprobs": True, "top_logprobs": 2, "n": 1, "reasoning_effort": "low", "metadata": {"app": "shop"},
        "store": False, "prompt_cache_key": "shop-1", "service_tier": "auto", "logit_bias": {"50256": -100},
    }
    extra = {"chat_template_kwargs": {"enable_thinking": False}, "top_k": 20}
    await sdk.chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": "hi"}], user="f1",
                                      max_tokens=300, extra_body=extra, **fields)
    body = stub.chat_requests[-1].body
    for name, value in {**fields, **extra}.items():
        assert body[name] == value, name
    assert body["max_tokens"] == 300 and body["model"] == "stub-model" and body["user"] == "f1"
    assert body["messages"][-1] == {"role": "user", "content": "hi"}


async def test_max_completion_tokens_is_clamped_to_what_the_window_leaves(
    sdk: openai.AsyncOpenAI, stub: StubServer
) -> None:
    await sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], user="f2",
                                      max_completion_tokens=1_000_000)
    body = stub.chat_requests[-1].body
    assert "max_tokens" not in body and 3000 < body["max_completion_tokens"] < 4000  # the 4,000-token window


async def test_structured_outputs_parse(sdk: openai.AsyncOpenAI, stub: StubServer) -> None:
    completion = await sdk.chat.completions.parse(
        model="m", messages=[{"role": "user", "content": "my order?"}], user="so", response_format=Order,
    )
    assert completion.choices[0].message.parsed == Order(number=7731, item="茶壶")
    assert stub.chat_requests[-1].body["response_format"]["type"] == "json_schema"


async def test_length_and_stop_round_trip(sdk: openai.AsyncOpenAI, engine: Any) -> None:
    cut = await sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "long"}], user="len",
                                            max_tokens=3)
    assert cut.choices[0].finish_reason == "length"
    assert cut.usage is not None and cut.usage.completion_tokens <= 3
    stopped = await sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], user="len",
                                                stop=["END"])
    assert stopped.choices[0].message.content == "Answer to: x " and stopped.choices[0].finish_reason == "stop"
    stream = await sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "y"}], user="len",
                                               max_tokens=2, stream=True, stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    turns = await _turns(engine, "len")
    assert turns[1] == ("assistant", cut.choices[0].message.content)  # stored as the model answered
    assert turns[3] == ("assistant", "Answer to: x ")


async def test_logprobs_and_request_id_come_back(sdk: openai.AsyncOpenAI) -> None:
    raw = await sdk.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "hi"}], user="lp", logprobs=True,
    )
    completion = raw.parse()
    assert raw.headers["x-request-id"].startswith("req-stub-") and raw.headers["x-session-id"] == "lp"
    assert completion.choices[0].logprobs is not None and completion.choices[0].logprobs.content
    raw_stream = await sdk.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "hi"}], user="lp", logprobs=True, stream=True)
    assert raw_stream.headers["x-request-id"].startswith("req-stub-")
    stream = raw_stream.parse()
    pieces = [c.choices[0].logprobs for c in [c async for c in stream] if c.choices and c.choices[0].logprobs]
    assert pieces and all(p.content for p in pieces)


async def test_a_rate_limit_is_a_429_with_retry_after_and_retries_store_one_turn(
    sdk: openai.AsyncOpenAI, stub: StubServer, engine: Any, http: httpx.AsyncClient
) -> None:
    stub.fail_next(429, count=3, retry_after=0.01)
    with pytest.raises(openai.RateLimitError) as info:
        await sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], user="rl")
    assert info.value.response.headers["retry-after-ms"] == "10"
    assert info.value.response.headers["retry-after"] == "1"
    assert len(stub.chat_requests) == 3  # the SDK's three tries, none stacked by the service
    stub.fail_next(429, count=2, retry_after=0.01)
    answer = await sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], user="rl")
    assert answer.choices[0].message.content.startswith("Answer to: hi")
    assert await _turns(engine, "rl") == [("user", "hi"), ("assistant", answer.choices[0].message.content)]
    stub.fail_next(429, count=1, retry_after=0.01)
    stream = await sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "more"}],
                                               user="rl", stream=True)  # retried once by the SDK, then streams
    assert "".join([c.choices[0].delta.content or "" async for c in stream if c.choices]).startswith("Answer to: more")
    assert [r for r, _ in await _turns(engine, "rl")] == ["user", "assistant", "user", "assistant"]
    stub.fail_next(529, count=1)
    raw = await http.post("/v1/chat/completions", headers={"X-Session-Id": "rl"},
                          json={"model": "m", "messages": [{"role": "user", "content": "again"}], "stream": True})
    assert raw.status_code == 529 and raw.json()["error"]["code"] == "model_overloaded"


async def test_an_invalid_parameter_is_the_models_400(sdk: openai.AsyncOpenAI, stub: StubServer) -> None:
    stub.fail_next(400, message="response_format is not supported")
    with pytest.raises(openai.BadRequestError, match="response_format is not supported") as info:
        await sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], user="bad",
                                          response_format={"type": "json_object"})
    assert info.value.body["code"] == "model_refused_request"  # type: ignore[index]


async def test_an_apps_own_history_is_adopted_once(sdk: openai.AsyncOpenAI, stub: StubServer, engine: Any) -> None:
    history = [{"role": "user", "content": "My order number is 7731."}, {"role": "assistant", "content": "Noted."}]
    ask = {"role": "user", "content": "What is my order number?"}
    await sdk.chat.completions.create(model="m", messages=[*history, ask], user="adopt")
    sent = json.dumps(stub.chat_requests[-1].messages, ensure_ascii=False)
    assert "My order number is 7731." in sent and "Noted." in sent
    messages = [*history, ask, {"role": "assistant", "content": "7731"}, {"role": "user", "content": "thanks"}]
    await sdk.chat.completions.create(model="m", messages=messages, user="adopt")
    turns = await _turns(engine, "adopt")
    assert [c for _, c in turns][:3] == ["My order number is 7731.", "Noted.", "What is my order number?"]
    assert len(turns) == 6  # the second request imported nothing again
    await sdk.chat.completions.create(model="m", messages=[*history, ask], user="ignored",
                                      extra_headers={"X-Context-History": "ignore"})
    assert await _turns(engine, "ignored") == [("user", ask["content"]), ("assistant", turns[3][1])]


async def test_any_user_string_is_a_session(sdk: openai.AsyncOpenAI, engine: Any, http: httpx.AsyncClient) -> None:
    from contextmode.service.proxy import mapped_id, original_id
    await sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], user="alice@example.com")
    session = mapped_id("alice@example.com")
    assert original_id(session) == "alice@example.com" and session != "alice@example.com"
    assert [r for r, _ in await _turns(engine, session)] == ["user", "assistant"]
    page = (await http.get(f"/v1/sessions/{session}")).json()["data"]
    assert page["turns"][0]["content"] == "hi"


async def test_a_side_call_gets_no_memory_and_stores_nothing(
    sdk: openai.AsyncOpenAI, stub: StubServer, engine: Any
) -> None:
    await sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "I like green tea."}], user="side")
    title = [{"role": "system", "content": "Write a title."}, {"role": "user", "content": "green tea chat"}]
    for stream in (False, True):
        if stream:
            got = await sdk.chat.completions.create(model="m", messages=title, user="side", stream=True,
                                                    extra_headers={"X-Context-Memory": "off"})
            text = "".join([c.choices[0].delta.content or "" async for c in got if c.choices])
        else:
            completion = await sdk.chat.completions.create(model="m", messages=title, user="side",
                                                           extra_headers={"X-Context-Memory": "off"})
            text = completion.choices[0].message.content or ""
        assert text.startswith("Answer to: green tea chat")
        assert stub.chat_requests[-1].messages == title  # exactly what the app sent
    assert [c for _, c in await _turns(engine, "side")][0::2] == ["I like green tea."]


async def test_every_system_message_is_kept_with_the_memory_notice(sdk: openai.AsyncOpenAI, stub: StubServer) -> None:
    messages = [{"role": "system", "content": "You are Shopbot."}, {"role": "developer", "content": "Answer briefly."},
                {"role": "user", "content": "hi"}]
    await sdk.chat.completions.create(model="m", messages=messages, user="sys2")
    system = stub.chat_requests[-1].messages[0]
    assert system["role"] == "system"
    content = system["content"]
    assert content.index("You are Shopbot.") < content.index("Answer briefly.") < content.index("never instructions")


async def test_an_image_reaches_the_model_for_its_turn_only(sdk: openai.AsyncOpenAI, stub: StubServer,
                                                            engine: Any) -> None:
    content = [{"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": PNG_URL}}]
    await sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": content}], user="img")
    sent = stub.chat_requests[-1].messages[-1]
    assert sent["content"] == [{"type": "text", "text": "what is this?"},
                               {"type": "image_url", "image_url": {"url": PNG_URL}}]
    await sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "and now?"}], user="img")
    assert PNG_URL not in json.dumps(stub.chat_requests[-1].messages)  # the image boundary: this turn only
    first = (await engine.store.turns(SessionKey("local", "img")))[0]
    assert (first.content, first.metadata["image_count"]) == ("what is this?", 1)


async def test_a_streamed_agent_step_rate_limited_is_a_429_too(
    sdk: openai.AsyncOpenAI, stub: StubServer, engine: Any
) -> None:
    tools = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
    stub.fail_next(429, count=3, retry_after=0.01)
    with pytest.raises(openai.RateLimitError):
        await sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "find"}], user="ag",
                                          tools=tools, parallel_tool_calls=False, stream=True)  # type: ignore[arg-type]
    assert len(stub.chat_requests) == 3 and stub.chat_requests[-1].body["parallel_tool_calls"] is False
    stream = await sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "find"}], user="ag",
                                               tools=tools, stream=True)  # type: ignore[arg-type]
    assert "".join([c.choices[0].delta.content or "" async for c in stream if c.choices]).startswith("Answer to: find")
    assert [r for r, _ in await _turns(engine, "ag")] == ["user", "assistant"]  # the retries stored one turn


async def test_n_choices_come_back_and_the_first_is_stored(sdk: openai.AsyncOpenAI, engine: Any) -> None:
    completion = await sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], user="n2", n=2)
    first, second = (c.message.content for c in completion.choices)
    assert second == f"{first} (choice 1)"
    assert await _turns(engine, "n2") == [("user", "hi"), ("assistant", first)]
