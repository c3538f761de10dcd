"""A 30-turn conversation through the Agents SDK's `Runner` with `ContextModeSession`.

The model is the SDK's own `OpenAIChatCompletionsModel` on the official ``openai`` client,
pointed at the project's stub server (real HTTP): it calls a tool on every other turn and
answers in text. Beyond the budget, what the model receives must carry the memory layers
(pins, summary, recall) and the history part must stay within the budget, with every
function call still followed by its output.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    RunConfig,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

from contextmode import ContextMode
from contextmode.integrations.openai_agents import ContextModeSession
from contextmode.settings import EngineSettings
from contextmode.testing.agents import wire_pairing_errors
from contextmode.testing.stub_server import StubAnswer, StubRequest, StubServer, StubToolCall

set_tracing_disabled(True)
BUDGET = 1200
INSTRUCTIONS = "You are a travel assistant."
FILLER = [
    "Let's plan the first day in Lisbon: a walk through Alfama and a tram ride.",
    "Which museums open on Mondays there?",
    "How long does the train to Sintra take?",
    "Tell me about the food markets near the river.",
    "What should I pack for rainy evenings?",
    "Is the airport far from the old town?",
]


def _reply(request: StubRequest) -> str | StubAnswer:
    last = request.messages[-1] if request.messages else {}
    user = request.last_user
    if last.get("role") == "user" and "weather" in user:
        n = len(request.messages)
        return StubAnswer(tool_calls=(StubToolCall(name="forecast", arguments=json.dumps({"day": user[-12:]}),
                                                   id=f"call_{n}_{len(user)}"),))
    return f"Noted: {user[:60]}"


@function_tool
def forecast(day: str) -> str:
    """The weather forecast for a day."""
    return f"Forecast for {day}: sunny spells, 22°C, light wind from the west, no rain expected. " * 3


@pytest.fixture
def stub() -> Iterator[tuple[StubServer, str]]:
    server = StubServer(reply=_reply)
    with server as url:
        yield server, url


def _messages_text(messages: list[dict[str, Any]]) -> str:
    return "\n".join(str(m.get("content") or "") for m in messages)


async def test_thirty_turns_through_runner(stub: tuple[StubServer, str]) -> None:
    server, url = stub
    memory = ContextMode(store="memory://", settings=replace(EngineSettings(), context_window=BUDGET, reply_reserve=0))
    session = ContextModeSession("trip", memory=memory)

    def make_agent() -> Agent[Any]:  # an HTTP client per run: run_sync runs on a loop of its own
        client = AsyncOpenAI(base_url=url, api_key="stub")
        return Agent(name="Assistant", instructions=INSTRUCTIONS, tools=[forecast],
                     model=OpenAIChatCompletionsModel(model="stub-model", openai_client=client),
                     model_settings=ModelSettings(temperature=0))

    messages = [
        "My cat is called Pixel and she hates travelling.",
        "I am vegetarian and I never eat spicy food.",
    ]
    for i in range(27):
        messages.append(FILLER[i % len(FILLER)] + (" And the weather that day?" if i % 2 else f" (day {i})"))
    messages.append("What did I tell you about my cat?")
    try:
        for i, text in enumerate(messages):
            run_config = RunConfig(call_model_input_filter=session.input_filter)
            if i % 5 == 4:  # run_sync: another thread and loop than the test's
                result = await asyncio.to_thread(Runner.run_sync, make_agent(), text, session=session, run_config=run_config)
            else:
                result = await Runner.run(make_agent(), text, session=session, run_config=run_config)
            assert result.final_output.startswith("Noted:")
            await session.run_compaction()
        stored = await session.get_items(limit=10_000)
        assert sum(1 for item in stored if item.get("role") == "user") == len(messages) == 30
        assert any(item.get("type") == "function_call_output" for item in stored)
        # The last requests: memory layers, the budget, the pairing.
        last = server.chat_requests[-1].messages
        assert last[0] == {"role": "system", "content": INSTRUCTIONS}
        assert last[-1]["role"] == "user" and last[-1]["content"] == messages[-1]
        assert [m.get("content") for m in last].count(messages[-1]) == 1, "the new message once"
        text = _messages_text(last)
        assert "<summary>" in text, "the summary layer reached the model"
        assert "<constraints>" in text and "spicy" in text.split("</constraints>")[0], "pins reached the model"
        assert "<recall>" in text and "Pixel" in text.split("<recall>")[1], "recall found the cat for the question"
        assert "My cat is called Pixel" not in [m.get("content") for m in last], "turn 1 itself is out of the window"
        assert wire_pairing_errors(last) == []
        context = session.last_context
        assert context is not None and context.total_tokens <= BUDGET
        counter = memory.engine.counter

        def history_tokens(request: StubRequest) -> int:  # without the instructions and the new message
            return sum(counter.count(str(m.get("content") or "")) + counter.count(json.dumps(m.get("tool_calls") or ""))
                       for m in request.messages[1:-1])

        firsts = [r for r in server.chat_requests if r.messages[-1]["role"] == "user"]
        assert len(firsts) == 30
        assert all(history_tokens(r) <= BUDGET for r in firsts)
        assert all("<summary>" in _messages_text(r.messages) for r in firsts[-8:])
        assert all(wire_pairing_errors(r.messages) == [] for r in server.chat_requests)
    finally:
        memory.close()
