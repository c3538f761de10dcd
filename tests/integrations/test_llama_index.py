"""contextmode.integrations.llama_index with the real llama-index-core and its own mock
LLMs (nothing is mocked but the model's answers)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole, TextBlock, ToolCallBlock
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.llms.mock import MockLLMWithChatMemoryOfLastCall
from llama_index.core.memory import ChatMemoryBuffer

from contextmode import ContextMode
from contextmode.integrations.llama_index import ContextModeMemory, context_to_messages
from contextmode.settings import EngineSettings

BUDGET = 1200

FILLER = [
    "The weather was grey all day so I stayed in and tidied the flat, then read for a while.",
    "Work has been busy, lots of meetings about the quarterly report and the budget review.",
    "Traffic was terrible this morning, the bus was twenty minutes late and very crowded.",
    "We watched a documentary about whales last night, pretty relaxing after a long week.",
    "I tried a new running route along the canal; it was longer than I expected, nine km.",
    "My neighbour is renovating the kitchen and the drilling starts at eight every day.",
]


@pytest.fixture
def memory() -> Iterator[ContextMode]:
    with ContextMode(store="memory://", settings=EngineSettings(context_window=BUDGET, reply_reserve=0)) as cm:
        yield cm


def _system_text(messages: list[ChatMessage]) -> str:
    return "\n".join(m.content or "" for m in messages if m.role == MessageRole.SYSTEM)


def test_chat_engine_30_turns_gets_summary_pins_and_recall_within_budget(memory: ContextMode) -> None:
    llm = MockLLMWithChatMemoryOfLastCall(max_tokens=6)
    chat_memory = ContextModeMemory("li-30", memory=memory)
    engine = SimpleChatEngine.from_defaults(llm=llm, memory=chat_memory)
    said = [
        "I am vegetarian and my budget is under 50 euros.",
        "My sister Marmalade lives in Lisbon and teaches piano.",
        *[FILLER[i % len(FILLER)] + f" (day {i})" for i in range(27)],
    ]
    for text in said:
        engine.chat(text)
        memory.drain()  # the summary and pins are background jobs
    engine.chat("Where does my sister Marmalade live?")

    context = chat_memory.last_context
    assert context is not None
    assert context.total_tokens <= BUDGET
    assert {"summary", "constraints", "recall"} <= {layer.name for layer in context.layers}
    sent = list(llm.last_chat_messages or [])
    system = _system_text(sent)
    summary = context.layer("summary")
    assert summary is not None and summary.items[0].text in system
    assert "vegetarian" in system.lower()
    recalled = context.layer("recall")
    assert recalled is not None and any("Marmalade lives in Lisbon" in item.text for item in recalled.items)
    assert "Marmalade lives in Lisbon" in system
    assert sent[-1].role == MessageRole.USER and sent[-1].content == "Where does my sister Marmalade live?"
    assert [(m.role, m.content) for m in sent] == [(m.role, m.content) for m in context_to_messages(context)]
    assert len(sent) < 2 * 30
    # every message is kept, equal to what the engine put
    everything = chat_memory.get_all()
    assert len(everything) == 60
    assert everything[0] == ChatMessage(role="user", content=said[0])
    assert everything[-1] == ChatMessage(role="assistant", content="text text text text text text")


async def test_async_chat_engine(memory: ContextMode) -> None:
    llm = MockLLMWithChatMemoryOfLastCall(max_tokens=3)
    engine = SimpleChatEngine.from_defaults(llm=llm, memory=ContextModeMemory("li-async", memory=memory))
    await engine.achat("I prefer trains to planes.")
    await engine.achat("How should I travel to Porto?")
    sent = list(llm.last_chat_messages or [])
    assert [m.content for m in sent if m.role == MessageRole.USER] == [
        "I prefer trains to planes.", "How should I travel to Porto?"]
    assert len(memory.turns("li-async")) == 4


def _conversation() -> list[ChatMessage]:
    return [
        ChatMessage(role="system", content="You are terse."),
        ChatMessage(role="user", content="Weather in Lisbon and Porto? 谢谢", additional_kwargs={"name": "ana"}),
        ChatMessage(role="assistant", blocks=[
            TextBlock(text="Checking."),
            ToolCallBlock(tool_call_id="c1", tool_name="weather", tool_kwargs={"city": "Lisbon"}),
            ToolCallBlock(tool_call_id="c2", tool_name="weather", tool_kwargs={"city": "Porto"})]),
        ChatMessage(role="tool", content="sunny", additional_kwargs={"tool_call_id": "c1"}),
        ChatMessage(role="tool", content="rain", additional_kwargs={"tool_call_id": "c2"}),
        ChatMessage(role="assistant", blocks=[TextBlock(text="Lisbon sunny, "), TextBlock(text="Porto rain.")]),
    ]


def test_messages_round_trip_equal(memory: ContextMode) -> None:
    chat_memory = ContextModeMemory("li-rt", memory=memory)
    conversation = _conversation()
    chat_memory.put_messages(conversation[:2])
    for message in conversation[2:]:
        chat_memory.put(message)
    assert chat_memory.get_all() == conversation
    assert ContextModeMemory("li-rt", memory=memory).get_all() == conversation
    turns = memory.turns("li-rt")
    assert [t.role for t in turns] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert [c.arguments for c in turns[2].tool_calls] == ['{"city": "Lisbon"}', '{"city": "Porto"}']
    assert turns[4].tool_call_id == "c2"


async def test_async_set_get_reset(memory: ContextMode, tmp_path: Path) -> None:
    chat_memory = ContextModeMemory.from_defaults("li-set", memory=memory)
    await chat_memory.aput_messages(_conversation())
    await chat_memory.aset([ChatMessage(role="user", content="start again")])
    assert await chat_memory.aget_all() == [ChatMessage(role="user", content="start again")]
    got = await chat_memory.aget()
    assert got[-1] == ChatMessage(role="user", content="start again")
    assert await chat_memory.aget() == got  # asked again before any write: the same context
    await chat_memory.areset()
    assert await chat_memory.aget_all() == [] and await chat_memory.aget() == []


def test_get_continues_a_tool_step(memory: ContextMode) -> None:
    chat_memory = ContextModeMemory("li-step", memory=memory)
    chat_memory.put_messages(_conversation()[:5])
    sent = chat_memory.get()
    assert [m.role for m in sent[-4:]] == [MessageRole.USER, MessageRole.ASSISTANT, MessageRole.TOOL, MessageRole.TOOL]
    calls = [b for b in sent[-3].blocks if isinstance(b, ToolCallBlock)]
    assert [(c.tool_call_id, c.tool_kwargs) for c in calls] == [("c1", {"city": "Lisbon"}), ("c2", {"city": "Porto"})]
    assert sent[-1].additional_kwargs == {"tool_call_id": "c2"}


def test_a_drop_in_for_chat_memory_buffer(memory: ContextMode) -> None:
    """The same chat engine code works with either memory and the model sees the same
    short conversation (nothing to summarise or recall yet)."""
    seen = []
    for chat_memory in (ChatMemoryBuffer.from_defaults(token_limit=BUDGET), ContextModeMemory("li-drop", memory=memory)):
        llm = MockLLMWithChatMemoryOfLastCall(max_tokens=2)
        engine = SimpleChatEngine.from_defaults(llm=llm, memory=chat_memory)
        engine.chat("hello")
        engine.chat("how are you?")
        seen.append([(m.role, m.content) for m in llm.last_chat_messages or [] if m.role != MessageRole.SYSTEM])
        assert [m.content for m in chat_memory.get_all()] == ["hello", "text text", "how are you?", "text text"]
    assert seen[0] == seen[1]


async def test_function_agent_uses_the_memory(memory: ContextMode) -> None:
    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.core.llms.mock import MockFunctionCallingLLM

    received: list[list[ChatMessage]] = []

    def respond(messages: list[ChatMessage], **kwargs: object) -> ChatMessage:
        received.append(list(messages))
        if messages[-1].role == MessageRole.USER and "weather" in (messages[-1].content or ""):
            return ChatMessage(role="assistant", blocks=[
                ToolCallBlock(tool_call_id="w1", tool_name="weather", tool_kwargs={"city": "Lisbon"})])
        return ChatMessage(role="assistant", content=f"answer {len(received)}")

    def weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    agent = FunctionAgent(tools=[weather], llm=MockFunctionCallingLLM(response_generator=respond))
    chat_memory = ContextModeMemory("li-agent", memory=memory)
    await agent.run("I am allergic to peanuts.", memory=chat_memory)
    memory.drain()
    await agent.run("What is the weather in Lisbon?", memory=chat_memory)
    # the tool step went to the model after the memory's context; the pin came from memory
    after_tool = received[-1]
    assert [m.role for m in after_tool[-2:]] == [MessageRole.ASSISTANT, MessageRole.TOOL]
    assert "peanut" in _system_text(after_tool).lower()
    user_turns = [m.content for m in after_tool if m.role == MessageRole.USER]
    assert user_turns == ["I am allergic to peanuts.", "What is the weather in Lisbon?"]
    # the agent hands its tool step to the memory too: stored as agent items
    assert [m.content for m in chat_memory.get_all()] == [
        "I am allergic to peanuts.", "answer 1", "What is the weather in Lisbon?", None, "sunny in Lisbon",
        "answer 3"]
    turns = memory.turns("li-agent")
    assert [t.role for t in turns] == ["user", "assistant", "user", "assistant", "tool", "assistant"]
    assert turns[3].tool_calls[0].id == "w1" and turns[4].tool_call_id == "w1"


def test_record_false_reads_a_session_and_stores_nothing(memory: ContextMode) -> None:
    memory.record("li-ro", "user", "My cat is called Pixel.")
    memory.record("li-ro", "assistant", "Lovely name.")
    llm = MockLLMWithChatMemoryOfLastCall(max_tokens=2)
    chat_memory = ContextModeMemory("li-ro", memory=memory, record=False)
    SimpleChatEngine.from_defaults(llm=llm, memory=chat_memory).chat("What is my cat called?")
    assert [m.content for m in llm.last_chat_messages or [] if m.role != MessageRole.SYSTEM] == [
        "My cat is called Pixel.", "Lovely name.", "What is my cat called?"]
    chat_memory.reset()  # erases nothing either
    assert len(memory.turns("li-ro")) == 2
