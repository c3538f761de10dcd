"""``POST /v1/responses`` with memory: the official openai SDK's ``responses.create`` and the
OpenAI Agents SDK's default model class (``OpenAIResponsesModel``), the stub server as the
model (it speaks chat completions; the proxy relays the request in those names)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIResponsesModel,
    RunConfig,
    Runner,
    function_tool,
    set_tracing_disabled,
)

from contextmode.testing.stub_server import StubAnswer, StubRequest, StubServer, StubToolCall
from contextmode.types import SessionKey

set_tracing_disabled(True)


def reply(request: StubRequest) -> str | StubAnswer:
    """Calls ``weather`` when offered and no result came back yet; else recalls what it was told."""
    body = request.body if isinstance(request.body, dict) else {}
    seen = json.dumps(request.messages, ensure_ascii=False)
    if body.get("tools") and request.messages[-1].get("role") == "user":
        return StubAnswer(tool_calls=(StubToolCall(name="weather", arguments='{"city": "Lisbon"}'),))
    if request.messages[-1].get("role") == "tool":
        return f"Tool said: {request.messages[-1].get('content')}"
    asked = "order" in request.last_user and request.last_user.endswith("?")
    return "Your order is 7731." if "7731" in seen and asked else f"Noted: {request.last_user}"


@pytest.fixture
async def sdk(proxy_app: Any) -> AsyncIterator[openai.AsyncOpenAI]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=proxy_app), base_url="http://test") as http:
        yield openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", http_client=http)


async def test_responses_create_answers_with_memory(sdk: openai.AsyncOpenAI, stub: StubServer, engine: Any) -> None:
    first = await sdk.responses.create(model="m", input="My order number is 7731.", user="r1",
                                       instructions="You are Shopbot.", temperature=0.4, max_output_tokens=100)
    assert first.output_text == "Noted: My order number is 7731." and first.status == "completed"
    body = stub.chat_requests[-1].body
    assert (body["temperature"], body["max_tokens"]) == (0.4, 100) and "input" not in body
    assert body["messages"][0]["content"].startswith("You are Shopbot.")
    second = await sdk.responses.create(model="m", input="What is my order number?", user="r1")
    assert second.output_text == "Your order is 7731."  # memory: the first turn is in the context
    assert second.usage is not None and second.usage.input_tokens > 0
    turns = [t.content for t in await engine.store.turns(SessionKey("local", "r1"))]
    assert turns == ["My order number is 7731.", first.output_text, "What is my order number?", second.output_text]


async def test_responses_stream_events(sdk: openai.AsyncOpenAI) -> None:
    stream = await sdk.responses.create(model="m", input="hello", user="r2", stream=True)
    events = [e async for e in stream]
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "Noted: hello" and events[-1].response.output_text == "Noted: hello"  # type: ignore[union-attr]


async def test_structured_output_and_length(sdk: openai.AsyncOpenAI, stub: StubServer) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    cut = await sdk.responses.create(model="m", input="a long question", user="r3", max_output_tokens=2,
                                     text={"format": {"type": "json_schema", "name": "N", "schema": schema}},
                                     reasoning={"effort": "low"})
    body = stub.chat_requests[-1].body
    assert body["response_format"] == {"type": "json_schema", "json_schema": {"name": "N", "schema": schema}}
    assert body["reasoning_effort"] == "low"
    assert cut.status == "incomplete" and cut.incomplete_details is not None


async def test_agents_sdk_default_model_runs_a_tool_loop_with_memory(sdk: openai.AsyncOpenAI, stub: StubServer,
                                                                     engine: Any) -> None:
    @function_tool
    def weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    model = OpenAIResponsesModel(model="m", openai_client=sdk)
    agent = Agent(name="travel", instructions="You plan trips.", model=model, tools=[weather],
                  model_settings=ModelSettings(extra_headers={"X-Session-Id": "trip"}))
    for streamed in (False, True):
        if streamed:
            run = Runner.run_streamed(agent, "Weather in Lisbon?", run_config=RunConfig(tracing_disabled=True))
            async for _ in run.stream_events():
                pass
            output = run.final_output
        else:
            output = (await Runner.run(agent, "Weather in Lisbon?", run_config=RunConfig(tracing_disabled=True))).final_output
        assert output == "Tool said: sunny in Lisbon"
    roles = [t.role for t in await engine.store.turns(SessionKey("local", "trip"))]
    assert roles.count("tool") == 2 and roles.count("user") == 2  # each item stored once
