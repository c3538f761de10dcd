"""Agent items through the engine: recall finds a tool result by its content, summaries
describe calls in a sentence, and the library shows tool items."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta

from contextmode.assembly.agent import as_sentence
from contextmode.engine.agent import AgentRequest, ToolResult
from contextmode.memory.recall import Recaller
from contextmode.store.memory import MemoryStore
from contextmode.testing.models import FunctionModel
from contextmode.types import NewTurn, SessionKey, ToolCall, tool_metadata
from tests.service.test_service import make_engine

T0 = datetime(2026, 1, 5, tzinfo=UTC)
_FILLER = ["the weather is nice", "let us talk about music", "I had pasta for lunch", "work was busy today"]


async def test_recall_finds_a_tool_result_by_its_content() -> None:
    store = MemoryStore()
    call = ToolCall(id="c1", name="read_file", arguments='{"path": "deploy.log"}')
    turns = [
        NewTurn(role="user", content="check the deploy log", tokens=4, created_at=T0),
        NewTurn(role="assistant", content="", tokens=9, metadata=tool_metadata(tool_calls=[call]), created_at=T0),
        NewTurn(role="tool", content="deploy failed: certificate for payments.example expired on 2026-01-02",
                tokens=14, metadata=tool_metadata(tool_call_id="c1", tool_name="read_file"), created_at=T0),
    ]
    turns += [NewTurn(role="user" if i % 2 else "assistant", content=random.Random(i).choice(_FILLER), tokens=4,
                      created_at=T0 + timedelta(minutes=i)) for i in range(60)]
    await store.append(SessionKey("t", "s"), turns)
    state = await store.load(SessionKey("t", "s"), recent=8)
    recalled = await Recaller().recall(store, state, "which certificate expired?")
    assert recalled and recalled[0].seq == 3 and recalled[0].role == "tool"


def test_summaries_see_calls_and_results_as_sentences() -> None:
    from contextmode.types import Turn

    call = Turn(seq=2, role="assistant", content="", tokens=9, created_at=T0,
                metadata=tool_metadata(tool_calls=[ToolCall(id="c", name="search", arguments='{"q": "Lisbon hotels", "max": 3}')]))
    result = Turn(seq=3, role="tool", content=json.dumps({"hotels": ["A", "B"], "cheapest": 80}), tokens=20, created_at=T0,
                  metadata=tool_metadata(tool_call_id="c", tool_name="search"))
    assert as_sentence(call).content == "Called search(q “Lisbon hotels”, max 3)."
    assert as_sentence(result).content == "search returned: hotels 2 items, cheapest 80"
    assert "{" not in as_sentence(result).content and as_sentence(result).tool_call_id is None


async def test_engine_summary_of_an_agent_session_has_no_raw_json() -> None:
    seen: list[str] = []

    class Recording:
        async def summarize(self, previous: object, turns: list[object]) -> object:
            from contextmode.processors.base import SummaryResult

            seen.extend(t.content for t in turns)  # type: ignore[attr-defined]
            return SummaryResult(text="summary")

    engine = make_engine(FunctionModel(lambda m: ["ok"]), summarizer=Recording(), summary_threshold=1)
    call = ToolCall(id="c", name="sql", arguments='{"query": "select 1"}')
    await engine.store.append(SessionKey("t", "s"), [
        NewTurn(role="user", content="count users", tokens=2),
        NewTurn(role="assistant", content="", tokens=9, metadata=tool_metadata(tool_calls=[call])),
        NewTurn(role="tool", content='[{"count": 42}]', tokens=9, metadata=tool_metadata(tool_call_id="c", tool_name="sql")),
        *(NewTurn(role="user", content=f"msg {i}", tokens=2) for i in range(12)),
    ])
    assert await engine.summarize_now("t", "s", force=True)
    assert "Called sql(query “select 1”)." in seen and "sql returned: 1 items" in seen
    assert not any(s.startswith(("{", "[")) for s in seen)
    await engine.close()


async def test_library_agent_loop_with_a_function_model() -> None:
    """Without a tool-calling model the step still runs: tool results in, a text answer out."""
    engine = make_engine(FunctionModel(lambda m: [f"{len(m)} messages, last {m[-1].role}"]))
    await engine.store.append(SessionKey("t", "s"), [
        NewTurn(role="user", content="look it up", tokens=3),
        NewTurn(role="assistant", content="", tokens=9,
                metadata=tool_metadata(tool_calls=[ToolCall(id="a", name="search"), ToolCall(id="b", name="search")])),
    ])
    request = AgentRequest(tool_results=(ToolResult(call_id="b", content="two"), ToolResult(call_id="a", content="one")))
    events = [e async for e in engine.stream_agent(SessionKey("t", "s"), request)]
    done = events[-1].result
    assert done is not None and done.answer.endswith("last tool") and done.tool_calls == ()
    roles = [m.role for m in events[0].prepared.messages]  # type: ignore[union-attr]
    assert roles == ["system", "user", "assistant", "tool", "tool"]
    stored = await engine.store.turns(SessionKey("t", "s"))
    assert [t.tool_call_id for t in stored if t.role == "tool"] == ["b", "a"]
    assert stored[-1].metadata["reply_to"] == 1
    await engine.close()
