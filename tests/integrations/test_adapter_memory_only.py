"""What every adapter hands its framework is memory only, within the budget.

- The application's system prompt is the only persona: no adapter sends the engine's
  default system prompt ("You are a helpful assistant…"), with or without memory layers.
- Over the budget, the newest user message alone gets the same clear error on every path
  (``put`` + ``get``, ``put_messages`` + ``get``, ``add_items`` + ``get_items``, a run's
  prompt), never the raw history unbudgeted.
- pydantic-ai: the memory layers the adapter rendered come back in ``message_history`` and
  are recognised, so 50 continued runs at a 300-token budget stay bounded.

Each framework is the real one; only the model's answers are scripted.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.llms.mock import MockLLMWithChatMemoryOfLastCall
from pydantic_ai import Agent
from pydantic_ai.capabilities import ProcessHistory
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from contextmode import ContextMode
from contextmode.assembly.render import DEFAULT_SYSTEM_PROMPT
from contextmode.errors import MessageTooLarge
from contextmode.integrations import langchain as lc
from contextmode.integrations.llama_index import ContextModeMemory
from contextmode.integrations.openai_agents import ContextModeSession
from contextmode.integrations.pydantic_ai import ContextModeHistory
from contextmode.session_keys import id_for_key
from contextmode.settings import EngineSettings

DEFAULTS = tuple(DEFAULT_SYSTEM_PROMPT.values())
APP_PROMPT = "You are Kiki, the travel agency's assistant."
FILLER = [
    "We walked along the river and had coffee near the old bridge in the afternoon.",
    "The museum was closed so we went to the market and bought cheese and bread.",
    "Tomorrow we take the early train to the coast; the tickets were cheap this time.",
    "It rained all evening; we played cards at the hostel with two students from Porto.",
]


def _memory(budget: int) -> ContextMode:
    return ContextMode(store="memory://", settings=EngineSettings(context_window=budget, reply_reserve=0))


@pytest.fixture
def small() -> Iterator[ContextMode]:
    cm = _memory(300)
    yield cm
    cm.close()


@pytest.fixture
def roomy() -> Iterator[ContextMode]:
    cm = _memory(4000)
    yield cm
    cm.close()


def _no_default(texts: list[str]) -> None:
    for text in texts:
        assert not any(d in text for d in DEFAULTS), f"the engine's own system prompt was sent: {text[:80]!r}"


# -- 1. one persona ----------------------------------------------------------------------


def test_llama_index_get_without_memory_layers_has_no_system_message(roomy: ContextMode) -> None:
    memory = ContextModeMemory("persona-empty", memory=roomy)
    memory.put(ChatMessage(role="user", content="hello"))
    got = memory.get()
    assert [(m.role, m.content) for m in got] == [(MessageRole.USER, "hello")]
    memory.put(ChatMessage(role="assistant", content="hi there"))
    memory.put(ChatMessage(role="user", content="how are you?"))
    assert [m.role for m in memory.get()] == [MessageRole.USER, MessageRole.ASSISTANT, MessageRole.USER]


def test_llama_index_chat_engine_sends_one_persona(small: ContextMode) -> None:
    llm = MockLLMWithChatMemoryOfLastCall(max_tokens=4)
    memory = ContextModeMemory("persona-engine", memory=small)
    engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory, system_prompt=APP_PROMPT)
    engine.chat("I am vegetarian and I travel with my cat Pixel.")
    for i in range(10):
        engine.chat(FILLER[i % len(FILLER)])
        small.drain()
    engine.chat("What do you remember about my cat?")
    sent = list(llm.last_chat_messages or [])
    systems = [m.content or "" for m in sent if m.role == MessageRole.SYSTEM]
    assert systems[0] == APP_PROMPT
    _no_default(systems)
    assert sum(APP_PROMPT in s for s in systems) == 1
    assert memory.last_context is not None and memory.last_context.layer("system") is None
    assert len(systems) == 2 and "<" in systems[1], "the memory layers come as their own system message"


def test_langchain_context_to_messages_has_no_default_prompt(small: ContextMode) -> None:
    middleware = lc.ContextModeMiddleware("persona-lc", memory=small)
    session = middleware._session(None)
    state: list[BaseMessage] = []
    for i in range(8):
        state.append(HumanMessage(content=FILLER[i % len(FILLER)] + f" ({i})"))
        built = session.wait(middleware._context(session, state))
        state.append(AIMessage(content=f"ok {i}"))
        session.wait(middleware._answer(session, [*built, state[-1]]))
        small.drain()
    _no_default([str(m.content) for m in built if isinstance(m, SystemMessage)])
    assert isinstance(built[-1], HumanMessage)


async def test_openai_agents_items_have_no_default_prompt(small: ContextMode) -> None:
    session = ContextModeSession("persona-agents", memory=small)
    for i in range(20):
        await session.add_items([{"role": "user", "content": FILLER[i % len(FILLER)]},
                                 {"role": "assistant", "content": f"ok {i}"}])
    await session.add_items([{"role": "user", "content": "and now?"}])
    items = await session.get_items()
    assert session.last_context is not None, "beyond the budget: assembled"
    _no_default([str(i.get("content")) for i in items if isinstance(i, dict)])


# -- 2. over the budget: one clear error on every path ------------------------------------

HUGE = "Please read this very long message about my trip. " * 200


def test_llama_index_put_then_get_over_budget(small: ContextMode) -> None:
    memory = ContextModeMemory("big-put", memory=small)
    memory.put(ChatMessage(role="user", content=HUGE))
    with pytest.raises(MessageTooLarge):
        memory.get()


@pytest.mark.parametrize("tail", [[], [ChatMessage(role="assistant", content="ok")]], ids=["user-last", "answer-last"])
def test_llama_index_put_messages_then_get_over_budget(small: ContextMode, tail: list[ChatMessage]) -> None:
    memory = ContextModeMemory("big-put-messages", memory=small)
    memory.put_messages([ChatMessage(role="user", content="hi"), ChatMessage(role="assistant", content="hello"),
                         ChatMessage(role="user", content=HUGE), *tail])
    with pytest.raises(MessageTooLarge):
        memory.get()


async def test_llama_index_aput_messages_then_aget_over_budget(small: ContextMode) -> None:
    memory = ContextModeMemory("big-aput-messages", memory=small)
    await memory.aput_messages([ChatMessage(role="user", content=HUGE), ChatMessage(role="assistant", content="ok")])
    with pytest.raises(MessageTooLarge):
        await memory.aget()


async def test_openai_agents_get_items_over_budget(small: ContextMode) -> None:
    session = ContextModeSession("big-items", memory=small)
    await session.add_items([{"role": "user", "content": HUGE}])
    with pytest.raises(MessageTooLarge):
        await session.get_items()


def test_pydantic_ai_prompt_over_budget(small: ContextMode) -> None:
    agent: Agent[None, str] = Agent(FunctionModel(lambda m, i: ModelResponse(parts=[TextPart(content="ok")])),
                                    capabilities=[ProcessHistory(ContextModeHistory("big-run", memory=small))])
    agent.run_sync("hello")
    with pytest.raises(MessageTooLarge):
        agent.run_sync(HUGE)


def test_langchain_middleware_over_budget(small: ContextMode) -> None:
    middleware = lc.ContextModeMiddleware("big-lc", memory=small)
    session = middleware._session(None)
    with pytest.raises(MessageTooLarge):
        session.wait(middleware._context(session, [HumanMessage(content=HUGE)]))
    with pytest.raises(MessageTooLarge):  # the stored message continued (a tool step after it)
        session.wait(middleware._context(session, [HumanMessage(content=HUGE), AIMessage(content="ok")]))


# -- 4. pydantic-ai continuation --------------------------------------------------------


def _system_parts(messages: list[ModelMessage]) -> list[SystemPromptPart]:
    return [p for m in messages if isinstance(m, ModelRequest) for p in m.parts if isinstance(p, SystemPromptPart)]


def test_pydantic_ai_fifty_continued_runs_stay_bounded(small: ContextMode) -> None:
    seen: list[list[ModelMessage]] = []

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(list(messages))
        return ModelResponse(parts=[TextPart(content="Sure, noted.")])

    history = ContextModeHistory("continued", memory=small)
    agent: Agent[None, str] = Agent(FunctionModel(answer), system_prompt=APP_PROMPT,
                                    capabilities=[ProcessHistory(history)])
    result = agent.run_sync("I am vegetarian and my cat is called Pixel.")
    for i in range(49):
        result = agent.run_sync(FILLER[i % len(FILLER)] + f" ({i})", message_history=result.all_messages())
        small.drain()
    assert history.last_context is not None, "the runs went beyond the budget"
    counter = small.engine.counter
    for request in seen:
        parts = _system_parts(request)
        assert [p.content for p in parts].count(APP_PROMPT) == 1
        assert parts[0].content == APP_PROMPT
        memory_parts = [p.content for p in parts[1:]]
        assert len(memory_parts) == len(set(memory_parts)), "a memory layer is repeated"
        assert len(memory_parts) <= 5
        before_run = request[: max(i for i, m in enumerate(request)
                                   if any(isinstance(p, UserPromptPart) for p in m.parts))]
        history_tokens = sum(counter.count(str(getattr(p, "content", ""))) for m in before_run for p in m.parts
                             if not (isinstance(p, SystemPromptPart) and p.content == APP_PROMPT))
        assert history_tokens <= 300
    _no_default([p.content for p in _system_parts(seen[-1])])


# -- 3. any key ---------------------------------------------------------------------------

KEY = "user1/1-1dc5acabaf"


async def test_every_adapter_takes_any_key(roomy: ContextMode) -> None:
    llama = ContextModeMemory(KEY, memory=roomy, user_id="ana@example.com")
    await llama.aput_messages([ChatMessage(role="user", content="hi"), ChatMessage(role="assistant", content="hello")])
    assert llama.session_id == KEY and [m.content for m in await llama.aget_all()] == ["hi", "hello"]
    agents = ContextModeSession(KEY + "/agents", memory=roomy)
    await agents.add_items([{"role": "user", "content": "hey"}])
    assert agents.session_id == KEY + "/agents" and len(await agents.get_items()) == 1
    answer = FunctionModel(lambda m, i: ModelResponse(parts=[TextPart(content="ok")]))
    history = ContextModeHistory(KEY + "/pydantic", memory=roomy)
    await Agent(answer, capabilities=[history.capability]).run("hello there")
    middleware = lc.ContextModeMiddleware(memory=roomy)
    session = middleware._session({"configurable": {"thread_id": "thread 1/2"}})
    session.wait(middleware._context(session, [HumanMessage(content="yo")]))
    stored = {s: [t.content for t in roomy.turns(id_for_key(s))]
              for s in (KEY, KEY + "/agents", KEY + "/pydantic", "thread 1/2")}
    assert stored == {KEY: ["hi", "hello"], KEY + "/agents": ["hey"], KEY + "/pydantic": ["hello there", "ok"],
                      "thread 1/2": ["yo"]}


def test_langchain_state_system_message_stays_first_and_unstored(small: ContextMode) -> None:
    middleware = lc.ContextModeMiddleware("persona-state", memory=small)
    session = middleware._session(None)
    state: list[BaseMessage] = [SystemMessage(content=APP_PROMPT)]
    for i in range(8):
        state.append(HumanMessage(content=FILLER[i % len(FILLER)] + f" ({i})"))
        built = session.wait(middleware._context(session, state))
        assert built[0].content == APP_PROMPT
        assert [m.content for m in built].count(APP_PROMPT) == 1
        state = [*built, AIMessage(content=f"ok {i}")]  # the state as the agent's graph keeps it
        session.wait(middleware._answer(session, state))
        small.drain()
    assert all(t.role != "system" for t in small.turns("persona-state"))


def test_llama_index_set_with_what_get_gave_stores_no_memory_message(small: ContextMode) -> None:
    memory = ContextModeMemory("set-back", memory=small)
    for i in range(12):
        memory.put_messages([ChatMessage(role="user", content=FILLER[i % len(FILLER)] + f" ({i})"),
                             ChatMessage(role="assistant", content=f"ok {i}")])
        small.drain()
    memory.put(ChatMessage(role="user", content="What did we buy at the market?"))
    given = memory.get()
    assert given[0].role == MessageRole.SYSTEM, "beyond the budget: the memory message comes first"
    memory.set(given)
    assert all(m.role != MessageRole.SYSTEM for m in memory.get_all())
    memory.set([ChatMessage(role="system", content=APP_PROMPT), ChatMessage(role="user", content="hi")])
    assert [m.content for m in memory.get_all()] == [APP_PROMPT, "hi"], "the application's own is kept"
