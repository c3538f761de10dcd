"""contextmode.integrations.langchain with the real langchain / langgraph packages and
LangChain's own fake chat model (nothing is mocked but the model's answers)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from pydantic import Field

from contextmode import ContextMode
from contextmode.integrations.langchain import (
    ID_PREFIX,
    ContextModeChatMessageHistory,
    ContextModeMiddleware,
    context_to_messages,
)
from contextmode.settings import EngineSettings
from contextmode.types import SessionKey

BUDGET = 1200

FILLER = [
    "The weather was grey all day so I stayed in and tidied the flat, then read for a while.",
    "Work has been busy, lots of meetings about the quarterly report and the budget review.",
    "Traffic was terrible this morning, the bus was twenty minutes late and very crowded.",
    "We watched a documentary about whales last night, pretty relaxing after a long week.",
    "I tried a new running route along the canal; it was longer than I expected, nine km.",
    "My neighbour is renovating the kitchen and the drilling starts at eight every day.",
]


class RecordingModel(GenericFakeChatModel):
    """LangChain's fake chat model that also keeps every message list it was called with."""

    calls: list[list[BaseMessage]] = Field(default_factory=list)

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: Any = None, **kwargs: Any) -> Any:
        self.calls.append(list(messages))
        return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> RecordingModel:  # type: ignore[override]
        return self


def answers(first_calls_tool: bool = False) -> Iterator[AIMessage]:
    if first_calls_tool:
        yield AIMessage("", tool_calls=[{"name": "weather", "args": {"city": "Lisbon"}, "id": "call-1"}])
    n = 0
    while True:
        n += 1
        yield AIMessage(f"Noted, thanks for telling me (reply {n}).")


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny and 24 degrees in {city}"


@pytest.fixture
def memory() -> Iterator[ContextMode]:
    with ContextMode(store="memory://", settings=EngineSettings(context_window=BUDGET, reply_reserve=0)) as cm:
        yield cm


def _system_text(messages: Sequence[BaseMessage]) -> str:
    return "\n".join(str(m.content) for m in messages if isinstance(m, SystemMessage))


def test_create_agent_30_turns_gets_summary_pins_and_recall_within_budget(memory: ContextMode) -> None:
    model = RecordingModel(messages=answers(first_calls_tool=True))
    middleware = ContextModeMiddleware("lc-30", memory=memory)
    agent = create_agent(model, tools=[weather], middleware=[middleware])
    said = [
        "I am vegetarian and my budget is under 50 euros.",
        "My sister Marmalade lives in Lisbon and teaches piano. How is the weather there?",
        *[FILLER[i % len(FILLER)] + f" (day {i})" for i in range(27)],
    ]
    for text in said:
        agent.invoke({"messages": [HumanMessage(text)]})
        memory.drain()  # the summary and pins are background jobs
    result = agent.invoke({"messages": [HumanMessage("Where does my sister Marmalade live?")]})

    context = middleware.last_context
    assert context is not None
    assert context.total_tokens <= BUDGET
    assert {"summary", "constraints", "recall"} <= {layer.name for layer in context.layers}
    sent = model.calls[-1]
    system = _system_text(sent)
    # what the model received is the context: the layers' words, the recalled early turn
    # (turn 2, long out of the recent window), the question last
    summary = context.layer("summary")
    assert summary is not None and summary.items[0].text in system
    assert "vegetarian" in system.lower()
    recalled = context.layer("recall")
    assert recalled is not None and any("Marmalade lives in Lisbon" in item.text for item in recalled.items)
    assert "Marmalade lives in Lisbon" in system
    assert isinstance(sent[-1], HumanMessage) and sent[-1].content == "Where does my sister Marmalade live?"
    assert len(sent) < 2 * 30  # not the whole history
    # the session holds everything: 30 questions, the first one's tool step, 30 answers
    turns = memory.turns("lc-30")
    assert [t.role for t in turns[:5]] == ["user", "assistant", "tool", "assistant", "user"]
    assert turns[1].tool_calls[0].name == "weather" and turns[2].tool_call_id == "call-1"
    assert sum(t.role == "user" for t in turns) == 30
    assert result["messages"][-1].content == turns[-1].content


def test_tool_step_is_sent_whole_and_answers_are_stored(memory: ContextMode) -> None:
    model = RecordingModel(messages=answers(first_calls_tool=True))
    agent = create_agent(model, tools=[weather], middleware=[ContextModeMiddleware("lc-tool", memory=memory)])
    agent.invoke({"messages": [HumanMessage("What is the weather in Lisbon?")]})
    second = model.calls[1]  # the call after the tool ran
    assert isinstance(second[-1], ToolMessage) and second[-1].tool_call_id == "call-1"
    assert "sunny and 24 degrees in Lisbon" in str(second[-1].content)
    call = second[-2]
    assert isinstance(call, AIMessage) and call.tool_calls[0]["args"] == {"city": "Lisbon"}
    roles = [(t.role, t.content) for t in memory.turns("lc-tool")]
    assert roles == [("user", "What is the weather in Lisbon?"), ("assistant", ""),
                     ("tool", "sunny and 24 degrees in Lisbon"),
                     ("assistant", "Noted, thanks for telling me (reply 1).")]


def test_thread_id_names_the_session_and_a_checkpointer_stores_nothing_twice(memory: ContextMode) -> None:
    from langgraph.checkpoint.memory import InMemorySaver

    model = RecordingModel(messages=answers())
    agent = create_agent(model, middleware=[ContextModeMiddleware(memory=memory)], checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "thread-7"}}
    for text in ("hello there", "my cat is called Pixel", "what is my cat called?"):
        state = agent.invoke({"messages": [HumanMessage(text)]}, config)
    turns = memory.turns("thread-7")
    assert [t.content for t in turns if t.role == "user"] == ["hello there", "my cat is called Pixel",
                                                             "what is my cat called?"]
    assert len(turns) == 6
    # the checkpointed state is the context the model got plus its answer, not a growing copy
    assert state["messages"][:-1] == model.calls[-1]
    assert [m.content for m in model.calls[-1] if not isinstance(m, SystemMessage)] == [
        "hello there", "Noted, thanks for telling me (reply 1).", "my cat is called Pixel",
        "Noted, thanks for telling me (reply 2).", "what is my cat called?"]


async def test_async_agent(memory: ContextMode) -> None:
    model = RecordingModel(messages=answers())
    agent = create_agent(model, middleware=[ContextModeMiddleware("lc-async", memory=memory)])
    await agent.ainvoke({"messages": [HumanMessage("I prefer trains to planes.")]})
    await agent.ainvoke({"messages": [HumanMessage("How should I travel to Porto?")]})
    sent = model.calls[-1]
    assert [m.content for m in sent if isinstance(m, HumanMessage)] == [
        "I prefer trains to planes.", "How should I travel to Porto?"]
    assert len(await memory.engine.store.turns(SessionKey(memory.tenant, "lc-async"))) == 4


def test_create_react_agent_pre_model_hook(memory: ContextMode) -> None:
    import warnings

    from langgraph.checkpoint.memory import InMemorySaver

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated in favour of create_agent, still shipped
        from langgraph.prebuilt import create_react_agent

        model = RecordingModel(messages=answers(first_calls_tool=True))
        middleware = ContextModeMiddleware("lc-react", memory=memory)
        agent = create_react_agent(model, [weather], pre_model_hook=middleware.pre_model_hook,
                                   checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "any"}}
    agent.invoke({"messages": [HumanMessage("I am allergic to peanuts. Weather in Lisbon?")]}, config)
    state = agent.invoke({"messages": [HumanMessage("Suggest a snack.")]}, config)
    # the graph's state keeps its own messages; the model got the assembled context
    assert not any((m.id or "").startswith(ID_PREFIX) for m in state["messages"])
    assert middleware.last_context is not None
    expected = context_to_messages(middleware.last_context)
    assert [(type(m), m.content) for m in model.calls[-1]] == [(type(m), m.content) for m in expected]
    assert "peanut" in _system_text(model.calls[-1]).lower()
    assert [t.role for t in memory.turns("lc-react")] == ["user", "assistant", "tool", "assistant", "user"]


# -- ContextModeChatMessageHistory ------------------------------------------------------


def _conversation() -> list[BaseMessage]:
    return [
        SystemMessage("You are terse.", id="m0"),
        HumanMessage("Weather in Lisbon and Porto?", id="m1", name="ana"),
        AIMessage("", id="m2", tool_calls=[
            {"name": "weather", "args": {"city": "Lisbon"}, "id": "c1"},
            {"name": "weather", "args": {"city": "Porto", "units": ["C"]}, "id": "c2"}]),
        ToolMessage("sunny", tool_call_id="c1", id="m3"),
        ToolMessage("rain", tool_call_id="c2", id="m4", status="success", artifact={"mm": 3}),
        AIMessage([{"type": "text", "text": "Lisbon sunny, "}, {"type": "text", "text": "Porto rain."}], id="m5",
                  response_metadata={"model_name": "fake"}),
        HumanMessage("Thanks! 谢谢", additional_kwargs={"lang": "mixed"}),
    ]


def test_history_round_trips_messages_equal(memory: ContextMode) -> None:
    history = ContextModeChatMessageHistory("h-1", memory=memory)
    conversation = _conversation()
    history.add_messages(conversation[:3])
    for message in conversation[3:]:
        history.add_message(message)
    assert history.messages == conversation
    # another instance on the same session reads the same (the store is the history)
    assert ContextModeChatMessageHistory("h-1", memory=memory).messages == conversation
    # and the engine sees the agent items as such
    turns = memory.turns("h-1")
    assert [t.role for t in turns] == ["system", "user", "assistant", "tool", "tool", "assistant", "user"]
    assert [c.id for c in turns[2].tool_calls] == ["c1", "c2"] and turns[4].tool_call_id == "c2"
    assert turns[5].content == "Lisbon sunny, Porto rain."


async def test_history_async_round_trip(memory: ContextMode) -> None:
    history = ContextModeChatMessageHistory("h-2", memory=memory)
    await history.aadd_messages(_conversation())
    assert await history.aget_messages() == _conversation()
    await history.aclear()
    assert await history.aget_messages() == []


def test_history_reads_turns_stored_by_the_library(memory: ContextMode) -> None:
    memory.record("h-3", "user", "I live in Porto.")
    memory.record("h-3", "assistant", "Porto is lovely.")
    assert ContextModeChatMessageHistory("h-3", memory=memory).messages == [
        HumanMessage("I live in Porto."), AIMessage("Porto is lovely.")]


def test_runnable_with_message_history(memory: ContextMode) -> None:
    import warnings

    from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated since langchain-core 1.6.4, still widely used
        from langchain_core.runnables.history import RunnableWithMessageHistory

        model = RecordingModel(messages=answers())
        prompt = ChatPromptTemplate.from_messages([MessagesPlaceholder("history"), ("human", "{question}")])
        chain = RunnableWithMessageHistory(
            prompt | model, lambda sid: ContextModeChatMessageHistory(sid, memory=memory),
            input_messages_key="question", history_messages_key="history")
    for question in ("My name is Ines.", "What is my name?"):
        chain.invoke({"question": question}, {"configurable": {"session_id": "h-4"}})
    assert [m.content for m in model.calls[-1]] == [
        "My name is Ines.", "Noted, thanks for telling me (reply 1).", "What is my name?"]
    assert [t.content for t in memory.turns("h-4")][-1] == "Noted, thanks for telling me (reply 2)."


def test_record_false_reads_a_session_and_stores_nothing(memory: ContextMode) -> None:
    memory.record("lc-ro", "user", "My cat is called Pixel.")
    memory.record("lc-ro", "assistant", "Lovely name.")
    model = RecordingModel(messages=answers())
    middleware = ContextModeMiddleware("lc-ro", memory=memory, record=False)
    create_agent(model, middleware=[middleware]).invoke({"messages": [HumanMessage("What is my cat called?")]})
    assert [m.content for m in model.calls[-1] if not isinstance(m, SystemMessage)] == [
        "My cat is called Pixel.", "Lovely name.", "What is my cat called?"]
    assert len(memory.turns("lc-ro")) == 2


def test_a_middleware_keeps_a_bounded_number_of_threads(memory: ContextMode, monkeypatch: pytest.MonkeyPatch) -> None:
    from langgraph.checkpoint.memory import InMemorySaver

    from contextmode.integrations import langchain as adapter

    monkeypatch.setattr(adapter, "SESSIONS_KEPT", 3, raising=False)
    middleware = ContextModeMiddleware(memory=memory)
    agent = create_agent(RecordingModel(messages=answers()), middleware=[middleware], checkpointer=InMemorySaver())
    for n in range(8):
        agent.invoke({"messages": [HumanMessage(f"hello from thread {n}")]}, {"configurable": {"thread_id": f"t{n}"}})
        assert len(middleware._sessions) <= 3 and len(middleware._stored) <= 3
    assert list(middleware._sessions) == ["t5", "t6", "t7"]
    # A thread whose entry was dropped picks up from the store: nothing is stored twice.
    agent.invoke({"messages": [HumanMessage("back on thread 0")]}, {"configurable": {"thread_id": "t0"}})
    assert [t.content for t in memory.turns("t0") if t.role == "user"] == ["hello from thread 0", "back on thread 0"]
    assert len(memory.turns("t0")) == 4
