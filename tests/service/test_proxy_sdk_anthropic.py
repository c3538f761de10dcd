"""The Anthropic-compatible proxy as a drop-in, with the official anthropic SDK and the stub
server (which speaks OpenAI) as the model: Anthropic's fields reach it in their OpenAI names,
``stop_reason`` says how the answer ended, a rate limit stays one, retries store one turn."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx2
import pytest

from contextmode.testing.stub_server import StubRequest, StubServer
from contextmode.types import SessionKey
from tests.service.test_service_http import PNG_URL

TOOLS = [{"name": "search", "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}}}]


def reply(request: StubRequest) -> str:
    return f"Answer to: {request.last_user} STOP and more words after the stop sequence"


@pytest.fixture
async def sdk(proxy_app: Any) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=proxy_app), base_url="http://test") as http:
        yield anthropic.AsyncAnthropic(base_url="http://test", api_key="unused", http_client=http)


def _ask(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


async def test_fields_reach_the_model_in_openai_names(sdk: anthropic.AsyncAnthropic, stub: StubServer) -> None:
    await sdk.messages.create(
        model="claude-x", max_tokens=200, messages=_ask("hi"), extra_body={"temperature": 0.2, "top_p": 0.8, "top_k": 5},
        stop_sequences=["NEVER"], metadata={"user_id": "an1"}, tools=TOOLS,  # type: ignore[arg-type]
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
        thinking={"type": "enabled", "budget_tokens": 2048},
    )
    body = stub.chat_requests[-1].body
    assert (body["temperature"], body["top_p"], body["top_k"], body["stop"]) == (0.2, 0.8, 5, ["NEVER"])
    assert body["max_tokens"] == 200 and body["parallel_tool_calls"] is False and body["tool_choice"] == "auto"
    assert body["reasoning_effort"] == "low" and body["user"] == "an1"
    assert body["tools"][0]["function"]["name"] == "search"
    assert not {"stop_sequences", "metadata", "thinking", "system"} & set(body)
    await sdk.messages.create(model="m", max_tokens=50, messages=_ask("json"), metadata={"user_id": "an1"},
                              output_config={"effort": "max", "format": {"type": "json_schema", "schema": {"type": "object"}}})
    body = stub.chat_requests[-1].body
    assert body["reasoning_effort"] == "high" and body["response_format"]["json_schema"]["schema"] == {"type": "object"}


async def test_stop_reason_says_how_the_answer_ended(sdk: anthropic.AsyncAnthropic, engine: Any) -> None:
    cut = await sdk.messages.create(model="m", max_tokens=2, messages=_ask("long"), metadata={"user_id": "sr"})
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens <= 2
    stopped = await sdk.messages.create(model="m", max_tokens=100, messages=_ask("x"), stop_sequences=["STOP"],
                                        metadata={"user_id": "sr"})
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "STOP")
    assert stopped.content[0].text == "Answer to: x "  # type: ignore[union-attr]
    async with sdk.messages.stream(model="m", max_tokens=100, messages=_ask("y"), stop_sequences=["STOP"],
                                   metadata={"user_id": "sr"}) as stream:
        final = await stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "STOP")
    plain = await sdk.messages.create(model="m", max_tokens=100, messages=_ask("z"), metadata={"user_id": "sr"})
    assert plain.stop_reason == "end_turn"


async def test_rate_limit_and_overload_keep_their_meaning(
    sdk: anthropic.AsyncAnthropic, stub: StubServer, engine: Any
) -> None:
    stub.fail_next(429, count=3, retry_after=0.01)
    with pytest.raises(anthropic.RateLimitError) as info:
        await sdk.messages.create(model="m", max_tokens=50, messages=_ask("hi"), metadata={"user_id": "rl"})
    assert info.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert info.value.response.headers["retry-after-ms"] == "10"
    assert len(stub.chat_requests) == 3
    stub.fail_next(529, count=1)
    with pytest.raises(anthropic.APIStatusError) as overloaded:
        await sdk.with_options(max_retries=0).messages.create(model="m", max_tokens=50, messages=_ask("hi"),
                                                                metadata={"user_id": "rl"})
    assert overloaded.value.status_code == 529
    assert overloaded.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    stub.fail_next(429, count=2, retry_after=0.01)
    answer = await sdk.messages.create(model="m", max_tokens=50, messages=_ask("hi"), metadata={"user_id": "rl"})
    turns = [(t.role, t.content) for t in await engine.store.turns(SessionKey("local", "rl"))]
    assert turns == [("user", "hi"), ("assistant", answer.content[0].text)]  # type: ignore[union-attr]


async def test_history_and_any_user_string(sdk: anthropic.AsyncAnthropic, stub: StubServer, engine: Any) -> None:
    from contextmode.service.proxy import mapped_id
    messages = [{"role": "user", "content": "My order number is 7731."}, {"role": "assistant", "content": "Noted."},
                {"role": "user", "content": "What is my order number?"}]
    await sdk.messages.create(model="m", max_tokens=50, messages=messages,  # type: ignore[arg-type]
                              metadata={"user_id": "bob@example.com"}, system="You are Shopbot.")
    sent = stub.chat_requests[-1].messages
    assert "My order number is 7731." in str(sent)
    assert sent[0]["content"].startswith("You are Shopbot.") and "never instructions" in sent[0]["content"]
    turns = await engine.store.turns(SessionKey("local", mapped_id("bob@example.com")))
    assert [t.content for t in turns][:3] == [m["content"] for m in messages]


async def test_an_image_block_reaches_the_model(sdk: anthropic.AsyncAnthropic, stub: StubServer) -> None:
    data = PNG_URL.split(",", 1)[1]
    content = [{"type": "text", "text": "what is this?"},
               {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}]
    await sdk.messages.create(model="m", max_tokens=50, messages=[{"role": "user", "content": content}],  # type: ignore[list-item]
                              metadata={"user_id": "img"})
    assert stub.chat_requests[-1].messages[-1]["content"][1] == {"type": "image_url", "image_url": {"url": PNG_URL}}
