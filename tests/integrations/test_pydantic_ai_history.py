"""A 30-turn conversation through pydantic-ai's `Agent` with `ContextModeHistory`.

The model is pydantic-ai's own `FunctionModel` (the framework's test model): it records
what it receives, calls a tool when asked about the weather and answers in text. Beyond the
budget, what it receives must carry the memory layers (pins, summary, recall), stay within
the budget, and keep every tool return after its call.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
from pydantic_ai import Agent
from pydantic_ai.capabilities import ProcessHistory
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from contextmode import ContextMode
from contextmode.integrations.pydantic_ai import ContextModeHistory
from contextmode.settings import EngineSettings

BUDGET = 1200
SYSTEM = "You are a travel assistant."
FILLER = [
    "Let's plan the first day in Lisbon: a walk through Alfama and a tram ride.",
    "Which museums open on Mondays there?",
    "How long does the train to Sintra take?",
    "Tell me about the food markets near the river.",
    "What should I pack for rainy evenings?",
    "Is the airport far from the old town?",
]


@pytest.fixture
def memory() -> Iterator[ContextMode]:
    cm = ContextMode(store="memory://", settings=replace(EngineSettings(), context_window=BUDGET, reply_reserve=0))
    yield cm
    cm.close()


def _prompt(message: ModelMessage) -> str:
    return next((str(p.content) for p in message.parts if isinstance(p, UserPromptPart)), "")


class Recorder:
    def __init__(self) -> None:
        self.calls: list[list[ModelMessage]] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.calls.append(list(messages))
        last = messages[-1]
        if "weather" in _prompt(last):
            return ModelResponse(parts=[ToolCallPart(tool_name="forecast", args={"day": _prompt(last)[-10:]})])
        asked = next((_prompt(m) for m in reversed(messages) if _prompt(m)), "")
        return ModelResponse(parts=[TextPart(content=f"Noted: {asked[:60]}")])


def _system_text(messages: list[ModelMessage]) -> str:
    return "\n".join(p.content for m in messages if isinstance(m, ModelRequest)
                     for p in m.parts if isinstance(p, SystemPromptPart))


def _pairing_errors(messages: list[ModelMessage]) -> list[str]:
    called: set[str] = set()
    errors = []
    for m in messages:
        for p in m.parts:
            if isinstance(p, ToolCallPart):
                called.add(p.tool_call_id)
            elif isinstance(p, ToolReturnPart) and p.tool_call_id not in called:
                errors.append(f"return {p.tool_call_id} without its call")
    return errors


def _agent(model: Recorder, capability: ProcessHistory) -> Agent[None, str]:  # type: ignore[type-arg]
    agent: Agent[None, str] = Agent(FunctionModel(model), system_prompt=SYSTEM, capabilities=[capability])

    @agent.tool_plain
    def forecast(day: str) -> str:
        """The weather forecast for a day."""
        return f"Forecast for {day}: sunny spells, 22°C, light wind from the west, no rain expected. " * 3

    return agent


def test_thirty_turns_through_agent(memory: ContextMode) -> None:
    history = ContextModeHistory("trip", memory=memory)
    model = Recorder()
    agent = _agent(model, history.capability)
    messages = ["My cat is called Pixel and she hates travelling.", "I am vegetarian and I never eat spicy food."]
    messages += [FILLER[i % len(FILLER)] + (" And the weather that day?" if i % 2 else f" (day {i})") for i in range(27)]
    messages.append("What did I tell you about my cat?")
    for text in messages:
        result = agent.run_sync(text)  # no message_history: the memory holds the conversation
        assert result.output.startswith("Noted:")
        memory.drain()
    turns = memory.turns("trip")
    assert sum(t.role == "user" for t in turns) == 30
    assert sum(t.role == "tool" for t in turns) == 13
    assert all(t.content.startswith("Noted:") for t in turns if t.role == "assistant" and not t.tool_calls)
    last = model.calls[-1]
    system = _system_text(last)
    assert system.startswith(SYSTEM)
    assert "<summary>" in system, "the summary layer reached the model"
    assert "<constraints>" in system and "spicy" in system.split("</constraints>")[0], "pins reached the model"
    assert "<recall>" in system and "Pixel" in system.split("<recall>")[1], "recall found the cat for the question"
    assert _prompt(last[-1]) == messages[-1]
    assert not any(_prompt(m).startswith("My cat is called Pixel") for m in last), "turn 1 itself is out of the window"
    context = history.last_context
    assert context is not None and context.total_tokens <= BUDGET
    counter = memory.engine.counter
    for call in model.calls:
        assert _pairing_errors(call) == []
        body = [p for m in call for p in m.parts if not (isinstance(p, SystemPromptPart) and p.content == SYSTEM)]
        run_start = max(i for i, m in enumerate(call) if _prompt(m))
        before = [p for m in call[:run_start] for p in m.parts
                  if not (isinstance(p, SystemPromptPart) and p.content == SYSTEM)]
        assert sum(counter.count(str(getattr(p, "content", "") or getattr(p, "args", ""))) for p in before) <= BUDGET
        assert body


def test_processor_alone_with_message_history(memory: ContextMode) -> None:
    """`history_processors`-style use: the application passes ``message_history``; answers are
    stored when the next run hands them back, nothing twice."""
    history = ContextModeHistory("plain", memory=memory)
    model = Recorder()
    agent = _agent(model, ProcessHistory(history))
    result = agent.run_sync("Hello, I'm Ana.")
    result = agent.run_sync("What's the weather tomorrow?", message_history=result.all_messages())
    result = agent.run_sync("Thanks!", message_history=result.all_messages())
    roles = [(t.role, t.content[:14]) for t in memory.turns("plain")]
    assert roles == [("user", "Hello, I'm Ana"), ("assistant", "Noted: Hello, "), ("user", "What's the wea"),
                     ("assistant", ""), ("tool", "Forecast for  "), ("assistant", "Noted: What's "), ("user", "Thanks!")]
    assert _system_text(model.calls[-1]) == SYSTEM
