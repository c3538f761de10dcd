"""`ContextModeSession` against the OpenAI Agents SDK's own session behaviour.

The first part mirrors, case by case, the SDK's session test suite
(openai/openai-agents-python, ``tests/test_session.py``, MIT licence): the same scenarios
and assertions, re-written here against `ContextModeSession` with the SDK's shipped
``agents.testing.ScriptedModel`` in place of the suite's private ``FakeModel``. The second
part checks what the SDK's suite leaves implicit: items of every kind come back equal and
in order, exactly as the SDK's `SQLiteSession` returns them for the same operations.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Iterator
from typing import Any

import pytest
from agents import Agent, RunConfig, Runner, SQLiteSession, TResponseInputItem, set_tracing_disabled
from agents.exceptions import UserError
from agents.memory.session import Session
from agents.testing import ScriptedModel, assistant_message

from contextmode import ContextMode
from contextmode.integrations.openai_agents import ContextModeSession

set_tracing_disabled(True)
RUNNERS = ["run", "run_sync", "run_streamed"]


@pytest.fixture
def memory() -> Iterator[ContextMode]:
    cm = ContextMode(store="memory://")
    yield cm
    cm.close()


def _run_sync_in_thread(agent: Agent[Any], data: Any, **kwargs: Any) -> Any:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return Runner.run_sync(agent, data, **kwargs)
    finally:
        loop.close()


async def run(method: str, agent: Agent[Any], data: Any, **kwargs: Any) -> Any:
    """One run through ``Runner.run``, ``Runner.run_sync`` (another thread, its own loop) or
    ``Runner.run_streamed`` (stream consumed)."""
    if method == "run":
        return await Runner.run(agent, data, **kwargs)
    if method == "run_sync":
        return await asyncio.to_thread(_run_sync_in_thread, agent, data, **kwargs)
    result = Runner.run_streamed(agent, data, **kwargs)
    async for _ in result.stream_events():
        pass
    return result


def last_input(model: ScriptedModel) -> list[Any]:
    call = model.last_call
    assert call is not None
    return list(call.input) if isinstance(call.input, list) else [call.input]


# -- the SDK suite's scenarios ---------------------------------------------------


def test_is_a_session(memory: ContextMode) -> None:
    assert isinstance(ContextModeSession("s", memory=memory), Session)


@pytest.mark.parametrize("method", RUNNERS)
async def test_memory_basic(memory: ContextMode, method: str) -> None:
    session = ContextModeSession("test_session_123", memory=memory)
    model = ScriptedModel([[assistant_message("San Francisco")], [assistant_message("California")]])
    agent = Agent(name="test", model=model)
    first = await run(method, agent, "What city is the Golden Gate Bridge in?", session=session)
    assert first.final_output == "San Francisco"
    second = await run(method, agent, "What state is it in?", session=session)
    assert second.final_output == "California"
    sent = last_input(model)
    assert len(sent) > 1
    assert sent[0]["content"] == "What city is the Golden Gate Bridge in?"
    assert sent[-1]["content"] == "What state is it in?"


@pytest.mark.parametrize("method", RUNNERS)
async def test_memory_explicit_instance(memory: ContextMode, method: str) -> None:
    session = ContextModeSession("test_session_456", memory=memory)
    model = ScriptedModel([[assistant_message("Hello")], [assistant_message("I remember you said hi")]])
    agent = Agent(name="test", model=model)
    assert (await run(method, agent, "Hi there", session=session)).final_output == "Hello"
    result = await run(method, agent, "Do you remember what I said?", session=session)
    assert result.final_output == "I remember you said hi"


@pytest.mark.parametrize("method", RUNNERS)
async def test_memory_different_sessions(memory: ContextMode, method: str) -> None:
    model = ScriptedModel([[assistant_message("I like cats")], [assistant_message("I like dogs")],
                           [assistant_message("Yes, you mentioned cats")]])
    agent = Agent(name="test", model=model)
    one = ContextModeSession("session_1", memory=memory)
    two = ContextModeSession("session_2", memory=memory)
    await run(method, agent, "I like cats", session=one)
    await run(method, agent, "I like dogs", session=two)
    result = await run(method, agent, "What did I say I like?", session=one)
    assert result.final_output == "Yes, you mentioned cats"
    contents = [i.get("content") for i in last_input(model) if isinstance(i, dict)]
    assert "I like cats" in contents and "I like dogs" not in contents


async def test_direct_add_get_clear(memory: ContextMode) -> None:
    session = ContextModeSession("direct_test", memory=memory)
    items: list[TResponseInputItem] = [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there!"},
    ]
    await session.add_items(items)
    retrieved = await session.get_items()
    assert [(i.get("role"), i.get("content")) for i in retrieved] == [("user", "Hello"), ("assistant", "Hi there!")]
    await session.clear_session()
    assert await session.get_items() == []


async def test_pop_item(memory: ContextMode) -> None:
    session = ContextModeSession("pop_test", memory=memory)
    assert await session.pop_item() is None
    items: list[TResponseInputItem] = [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there!"},
        {"role": "user", "content": "How are you?"},
    ]
    await session.add_items(items)
    assert len(await session.get_items()) == 3
    assert await session.pop_item() == items[2]
    after = await session.get_items()
    assert len(after) == 2 and after[-1].get("content") == "Hi there!"
    assert await session.pop_item() == items[1]
    assert await session.pop_item() == items[0]
    assert await session.pop_item() is None
    assert await session.get_items() == []


async def test_pop_only_affects_its_session(memory: ContextMode) -> None:
    one = ContextModeSession("session_1", memory=memory)
    two = ContextModeSession("session_2", memory=memory)
    await one.add_items([{"role": "user", "content": "Session 1 message"}])
    await two.add_items([{"role": "user", "content": "Session 2 message 1"},
                         {"role": "user", "content": "Session 2 message 2"}])
    popped = await two.pop_item()
    assert popped is not None and popped.get("content") == "Session 2 message 2"
    assert [i.get("content") for i in await one.get_items()] == ["Session 1 message"]
    assert [i.get("content") for i in await two.get_items()] == ["Session 2 message 1"]


async def test_get_items_with_limit(memory: ContextMode) -> None:
    session = ContextModeSession("count_test", memory=memory)
    items: list[TResponseInputItem] = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"{'Message' if i % 2 == 0 else 'Response'} {i // 2 + 1}"}
        for i in range(6)
    ]
    await session.add_items(items)
    assert await session.get_items() == items
    assert await session.get_items(limit=2) == items[-2:]
    assert await session.get_items(limit=4) == items[-4:]
    assert await session.get_items(limit=10) == items
    assert await session.get_items(limit=0) == []


@pytest.mark.parametrize("method", RUNNERS)
async def test_list_input_like_sqlite_session(memory: ContextMode, method: str) -> None:
    # The suite once required a callback for list inputs; SDK 0.24 accepts them: whatever
    # the installed SDK does with SQLiteSession, ContextModeSession does the same.
    seen = []
    for session in (SQLiteSession("test_validation"), ContextModeSession("test_validation", memory=memory)):
        model = ScriptedModel([[assistant_message("first")], [assistant_message("second")]])
        agent = Agent(name="test", model=model)
        try:
            await run(method, agent, "Hello", session=session)
            await run(method, agent, [{"role": "user", "content": "Test message"}], session=session)
            seen.append(("ok", last_input(model), await session.get_items()))
        except UserError as exc:
            seen.append(("error", str(exc), []))
    assert seen[0] == seen[1]


@pytest.mark.parametrize("method", RUNNERS)
async def test_callback_prepared_input(memory: ContextMode, method: str) -> None:
    session = ContextModeSession("session_1", memory=memory)
    history: list[TResponseInputItem] = [
        {"role": "user", "content": "Hello there."},
        {"role": "assistant", "content": "Hi, I'm here to assist you."},
    ]
    await session.add_items(history)

    def only_user(old: list[Any], new: list[Any]) -> list[Any]:
        return [item for item in old if item["role"] == "user"] + new

    model = ScriptedModel([[assistant_message("I'm gpt-4o")]])
    new_turn: list[Any] = [{"role": "user", "content": "What your name?"}]
    await run(method, Agent(name="test", model=model), new_turn, session=session,
              run_config=RunConfig(session_input_callback=only_user))
    assert last_input(model) == [history[0], new_turn[0]]


async def test_unicode_and_special_characters(memory: ContextMode) -> None:
    session = ContextModeSession("unicode_test", memory=memory)
    items: list[TResponseInputItem] = [
        {"role": "user", "content": "こんにちは"},
        {"role": "assistant", "content": "😊👍"},
        {"role": "user", "content": "Привет"},
        {"role": "user", "content": "O'Reilly"},
        {"role": "assistant", "content": "DROP TABLE sessions;"},
        {"role": "user", "content": '"SELECT * FROM users WHERE name = "admin";"'},
        {"role": "assistant", "content": "Robert'); DROP TABLE students;--"},
    ]
    await session.add_items(items)
    assert await session.get_items() == items


async def test_concurrent_writers_from_threads(memory: ContextMode) -> None:
    session = ContextModeSession("concurrent_test", memory=memory)
    items: list[TResponseInputItem] = [{"role": "user", "content": f"Message {i}"} for i in range(10)]

    def add(item: TResponseInputItem) -> None:
        asyncio.run(session.add_items([item]))  # each thread on its own loop

    with concurrent.futures.ThreadPoolExecutor(max_workers=5) as pool:
        list(pool.map(add, items))
    got = await session.get_items()
    assert sorted(i.get("content") for i in got) == sorted(i["content"] for i in items)  # type: ignore[typeddict-item]


async def test_add_items_failure_propagates_in_streamed(memory: ContextMode) -> None:
    session = ContextModeSession("test_exception_session", memory=memory)

    async def failing(_items: list[TResponseInputItem]) -> None:
        raise RuntimeError("Simulated session.add_items failure")

    session.add_items = failing  # type: ignore[method-assign]
    agent = Agent(name="test", model=ScriptedModel([[assistant_message("not reached")]]))
    result = Runner.run_streamed(agent, "Hello", session=session)

    async def consume() -> None:
        async for _ in result.stream_events():
            pass

    with pytest.raises(RuntimeError, match=r"Simulated session\.add_items failure"):
        await asyncio.wait_for(consume(), timeout=5.0)


# -- exact round trip, like SQLiteSession -------------------------------------------

AGENT_ITEMS: list[Any] = [
    {"role": "user", "content": "What's the weather in Paris and the time?"},
    {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "two tools"}]},
    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}',
     "id": "fc_1", "status": "completed"},
    {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": "{}", "id": "fc_2"},
    {"type": "function_call_output", "call_id": "call_1", "output": '{"sky": "sunny", "c": 21}'},
    {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "12:00"}]},
    {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
     "content": [{"type": "output_text", "text": "Sunny, 21°C, and it is noon.", "annotations": []}]},
    {"role": "user", "content": [{"type": "input_text", "text": "Thanks!"}]},
    {"role": "developer", "content": "Be brief."},
]


async def _script(session: Any) -> list[Any]:
    """The same operations on any session; what each returned."""
    seen: list[Any] = []
    await session.add_items(AGENT_ITEMS[:2])
    await session.add_items(AGENT_ITEMS[2:7])
    await session.add_items(AGENT_ITEMS[7:])
    seen.append(await session.get_items())
    for limit in (1, 3, 5, 9, 20):
        seen.append(await session.get_items(limit=limit))
    for _ in range(7):  # down into the turn that holds both calls
        seen.append(await session.pop_item())
        seen.append(await session.get_items())
    await session.add_items(AGENT_ITEMS[3:])
    seen.append(await session.get_items())
    seen.append(await session.get_items(limit=3))
    return seen


async def test_same_answers_as_sqlite_session(memory: ContextMode) -> None:
    reference = SQLiteSession("parity")
    expected = await _script(reference)
    reference.close()
    got = await _script(ContextModeSession("parity", memory=memory))
    assert got == expected
    assert expected[0] == AGENT_ITEMS


async def test_calls_are_stored_as_agent_turns(memory: ContextMode) -> None:
    session = ContextModeSession("agent_turns", memory=memory)
    await session.add_items(AGENT_ITEMS[:7])
    turns = memory.turns("agent_turns")
    assert [t.role for t in turns] == ["user", "assistant", "tool", "tool", "assistant"]
    assert [c.id for c in turns[1].tool_calls] == ["call_1", "call_2"]
    assert [t.tool_call_id for t in turns[2:4]] == ["call_1", "call_2"]
    assert turns[3].content == "12:00"


async def test_persists_in_sqlite_across_instances(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'cm.db'}"
    first = ContextMode(store=url)
    await ContextModeSession("kept", memory=first).add_items(AGENT_ITEMS)
    first.close()
    second = ContextMode(store=url)
    try:
        assert await ContextModeSession("kept", memory=second).get_items() == AGENT_ITEMS
    finally:
        second.close()


async def test_beyond_the_budget_get_items_is_the_assembled_context() -> None:
    session = ContextModeSession("long", budget=400)  # its own memory (CONTEXTMODE_HOME), 400 tokens
    try:
        big = "Result line with plenty of words about hotels and prices in Lisbon. " * 120
        for i in range(12):
            await session.add_items([
                {"role": "user", "content": f"Question {i}: my cat is called Pixel" if i == 0 else f"Question {i} about hotels"},
                {"type": "function_call", "call_id": f"c{i}", "name": "search", "arguments": "{}"},
                {"type": "function_call_output", "call_id": f"c{i}", "output": big if i == 10 else f"result {i}"},
                {"role": "assistant", "content": f"Answer {i}"},
            ])
        await session.run_compaction()
        items = await session.get_items()
        assert session.last_context is not None and session.last_context.total_tokens <= 400
        systems = [i for i in items if i.get("role") == "system"]
        assert systems and all(str(i.get("content", "")).startswith("## ") for i in systems)
        rest = items[len(systems):]
        assert rest[-4:] == (await session.get_items(limit=4))  # the latest exchange, verbatim
        calls = [i.get("call_id") for i in rest if i.get("type") == "function_call"]
        outputs = [i.get("call_id") for i in rest if i.get("type") == "function_call_output"]
        assert calls == outputs  # never a call without its output, nor an output without its call
        assert len(await session.get_items(limit=10_000)) == 48  # the store keeps everything
    finally:
        session.memory.close()


# -- the per-session locks ------------------------------------------------------------


async def test_many_sessions_do_not_grow_the_lock_map_and_a_held_lock_is_kept(memory: ContextMode) -> None:
    import gc
    import threading

    def keys() -> list[tuple[int, str]]:
        return [k for k in list(ContextModeSession._locks) if k[0] == id(memory)]

    held = ContextModeSession("held", memory=memory)
    released = asyncio.Event()
    acquired: dict[str, asyncio.Lock] = {}
    ready = threading.Event()

    async def hold() -> None:  # on the memory's loop thread, where the locks live
        async with held._lock():
            acquired["lock"] = held._lock()
            ready.set()
            await released.wait()

    holding = memory.submit(hold())
    assert ready.wait(timeout=10)
    lock = acquired.pop("lock")
    for n in range(200):
        session = ContextModeSession(f"many-{n}", memory=memory)
        await session.add_items([{"role": "user", "content": f"hello {n}"}])
        assert len(await session.get_items()) == 1
    gc.collect()
    assert keys() == [(id(memory), "held")]  # 200 idle sessions left no lock behind
    assert memory.submit(_lock_of(held)).result() is lock  # the lock in use was not replaced
    memory.submit(_set(released)).result()
    holding.result(timeout=10)
    del lock  # the last reference: now idle
    gc.collect()
    assert keys() == []


async def _lock_of(session: ContextModeSession) -> asyncio.Lock:
    return session._lock()


async def _set(event: asyncio.Event) -> None:
    event.set()


def test_session_settings_as_a_dict_like_the_sdks_sessions(memory: ContextMode) -> None:
    from agents import SessionSettings

    session = ContextModeSession("dict-settings", memory=memory, session_settings={"limit": 0})
    assert isinstance(session.session_settings, SessionSettings) and session.session_settings.limit == 0
    with pytest.raises(TypeError, match="limitt"):
        ContextModeSession("bad-settings", memory=memory, session_settings={"limitt": 1})
