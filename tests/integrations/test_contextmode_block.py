"""The `ContextMode` methods the framework adapters build on: storing several messages at
once (agent items included), removing the newest turn, continuing a stored session."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from contextmode import ContextMode
from contextmode.api import MessageRecord
from contextmode.errors import InputError
from contextmode.settings import EngineSettings
from contextmode.types import ChatMessage, Constraint, SessionKey, Summary, ToolCall


@pytest.fixture
def memory() -> Iterator[ContextMode]:
    cm = ContextMode(store="memory://", settings=replace(EngineSettings(), context_window=600, reply_reserve=0))
    yield cm
    cm.close()


def _records() -> list[MessageRecord]:
    call = ToolCall(id="c1", name="search", arguments='{"q": "Lisbon"}')
    return [
        MessageRecord(message=ChatMessage(role="user", content="Find hotels in Lisbon"), metadata={"k": 1}),
        MessageRecord(message=ChatMessage(role="assistant", content="", tool_calls=(call,))),
        MessageRecord(message=ChatMessage(role="tool", content="Hotel Avenida, 120 EUR", tool_call_id="c1")),
        MessageRecord(message=ChatMessage(role="assistant", content="Hotel Avenida is 120 EUR a night.")),
    ]


def test_record_messages_stores_agent_items_in_order(memory: ContextMode) -> None:
    stored = memory._run(memory.arecord_messages("s", _records()))
    assert [t.seq for t in stored] == [1, 2, 3, 4]
    turns = memory.turns("s")
    assert [t.role for t in turns] == ["user", "assistant", "tool", "assistant"]
    assert turns[0].metadata["k"] == 1 and turns[0].metadata["turn"] == 1
    assert turns[1].tool_calls == (ToolCall(id="c1", name="search", arguments='{"q": "Lisbon"}'),)
    assert turns[1].tokens > 0  # the call's name and arguments are counted
    assert turns[2].tool_call_id == "c1"


def test_pop_removes_the_newest_and_keeps_what_did_not_come_from_it(memory: ContextMode) -> None:
    memory._run(memory.arecord_messages("s", _records()))
    store, tenant = memory.engine.store, memory.tenant
    memory._run(store.commit_summary(SessionKey(tenant, "s"), Summary(text="Asked for hotels.", covers_seq=2, tokens=4),
                                     expected_version=0))
    pins = [Constraint(key="city", value="Lisbon", source_seq=1), Constraint(key="price", value="cheap", source_seq=4)]
    memory._run(store.commit_constraints(SessionKey(tenant, "s"), pins, expected_version=0))
    before = memory.turns("s")
    popped = memory._run(memory.apop("s"))
    assert popped == before[-1]
    after = memory.turns("s")
    assert after == before[:-1]  # same numbers, times, metadata
    state = memory._run(store.load(SessionKey(tenant, "s")))
    assert state.summary is not None and state.summary.text == "Asked for hotels."
    assert [c.key for c in state.constraints] == ["city"]
    assert memory._run(memory.apop("s")) == before[2]
    memory._run(memory.apop("s"))
    memory._run(memory.apop("s"))
    assert memory._run(memory.apop("s")) is None
    assert memory.turns("s") == []


def test_continue_keeps_the_latest_user_turn_and_its_step(memory: ContextMode) -> None:
    with pytest.raises(InputError):
        memory._run(memory.acontinue("empty"))
    memory._run(memory.arecord_messages("s", _records()[:3]))
    context = memory._run(memory.acontinue("s"))
    current = context.layer("current")
    assert current is not None and context.message == "Find hotels in Lisbon"
    assert [i.role for i in current.items] == ["user", "assistant", "tool"]
    assert context.total_tokens <= 600


def test_turns_between(memory: ContextMode) -> None:
    memory._run(memory.arecord_messages("s", _records()))
    assert [t.seq for t in memory._run(memory.aturns_between("s", 2, 3))] == [2, 3]
    assert [t.seq for t in memory._run(memory.aturns_between("s", 3))] == [3, 4]
    newest = memory._run(memory.anewest("s"))
    assert newest is not None and newest.seq == 4
    assert memory._run(memory.anewest("nothing")) is None
