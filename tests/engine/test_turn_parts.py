"""The engine's steps receive what they need (`TurnParts`), not the `Engine`; one request
shape (`TurnRequest`) asks for every turn, agent steps included."""

from __future__ import annotations

import ast
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from contextmode import build_engine
from contextmode.engine import TurnRequest
from contextmode.engine.agent import AgentRequest
from contextmode.errors import InputError
from contextmode.models.base import ModelEvent, TextDelta, ToolCallDelta, ToolChoice, ToolSpec
from contextmode.store.memory import MemoryStore
from contextmode.testing.models import FunctionModel
from contextmode.types import ChatMessage, SessionKey, ToolCall, ToolResult

ENGINE = Path(__file__).resolve().parents[2] / "src" / "contextmode" / "engine"
KEY = SessionKey("t", "s")
TOOLS: tuple[ToolSpec, ...] = ({"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}},)


def test_no_step_module_sees_the_engine() -> None:
    """Only `core.py` (and the package front) may name `Engine` or import `core`; nothing reads a
    private member of the engine."""
    for path in sorted(ENGINE.glob("*.py")):
        tree = ast.parse(path.read_text())
        imported = {
            alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            for alias in node.names if node.level and node.module in ("core", None)
        } | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module == "core"}
        names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
        private = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                   and isinstance(node.value, ast.Name) and node.value.id in ("engine", "parts")
                   and node.attr.startswith("_")}
        if path.name in ("core.py", "__init__.py"):
            continue
        assert not imported and "Engine" not in names, f"{path.name} reaches for the Engine"
        assert not private, f"{path.name} reads {private}"


class _NoticeModel:
    """Not the `OfflineResponder`: any model whose answers are notices says so."""

    name = "notices"
    answers_are_notices = True

    async def complete(self, messages: Sequence[ChatMessage], *, max_tokens: int | None = None) -> str:
        return "(No model configured) here is what would be sent"

    async def stream(self, messages: Sequence[ChatMessage], *, max_tokens: int | None = None) -> AsyncIterator[str]:
        yield await self.complete(messages)


async def test_a_model_that_answers_with_notices_is_asked_not_named() -> None:
    engine = build_engine(store=MemoryStore(), model=_NoticeModel())
    result = await engine.turn(TurnRequest(key=KEY, message="你好"))
    assert result.assistant_turn is not None and result.assistant_turn.notice
    assert result.assistant_turn.metadata["notice"] is True
    await engine.close()


async def test_a_collaborator_swapped_on_a_live_engine_serves_the_next_turn() -> None:
    engine = build_engine(store=MemoryStore(), model=FunctionModel(lambda m: ["first"]))
    assert (await engine.turn("t", "s", "one")).answer == "first"
    engine.model = FunctionModel(lambda m: ["second"])
    assert (await engine.turn("t", "s", "two")).answer == "second"
    await engine.close()


class _Caller:
    """A model that calls ``search`` once, then answers."""

    name = "caller"

    async def complete(self, messages: Sequence[ChatMessage], *, max_tokens: int | None = None) -> str:
        return "answer"

    async def stream(self, messages: Sequence[ChatMessage], *, max_tokens: int | None = None) -> AsyncIterator[str]:
        yield "answer"

    async def stream_events(
        self, messages: Sequence[ChatMessage], *, tools: Sequence[ToolSpec] = (),
        tool_choice: ToolChoice | None = None, max_tokens: int | None = None,
    ) -> AsyncIterator[ModelEvent]:
        if messages[-1].role == "tool":
            yield TextDelta(text=f"found: {messages[-1].content}")
            return
        yield ToolCallDelta(index=0, id="call_1", name="search", arguments='{"q": ')
        yield ToolCallDelta(index=0, arguments='"x"}')


async def test_one_request_shape_runs_an_agent_loop() -> None:
    engine = build_engine(store=MemoryStore(), model=_Caller())
    first = await engine.turn(TurnRequest(key=KEY, message="look it up", tools=TOOLS))
    assert first.tool_calls == (ToolCall(id="call_1", name="search", arguments='{"q": "x"}'),)
    results = (ToolResult(call_id="call_1", content="a page"),)
    second = await engine.turn(TurnRequest(key=KEY, tool_results=results, tools=TOOLS))
    assert second.answer == "found: a page" and second.tool_calls == ()
    turns = await engine.store.turns(SessionKey("t", "s"))
    assert [(t.role, t.tool_calls, t.tool_call_id) for t in turns] == [
        ("user", (), None), ("assistant", first.tool_calls, None), ("tool", (), "call_1"), ("assistant", (), None)]
    await engine.close()


async def test_stream_agent_is_the_same_request() -> None:
    step = AgentRequest(message="look it up", tools=TOOLS)
    request = step.request(KEY, system_prompt=None)
    assert request.agent_step and request.message == "look it up" and request.tools == TOOLS
    assert request.system_prompt is None
    engine = build_engine(store=MemoryStore(), model=_Caller())
    events = [e async for e in engine.stream_agent(KEY, step)]
    assert events[-1].kind == "done" and events[-1].result.tool_calls[0].name == "search"
    await engine.close()


def test_a_turn_asks_for_a_message_or_tool_results() -> None:
    with pytest.raises(InputError, match="user message or tool results"):
        TurnRequest(key=KEY)
    assert not TurnRequest(key=KEY, message="hi").agent_step
    assert TurnRequest(key=KEY, tool_results=(ToolResult(call_id="c", content="r"),)).agent_step
    with pytest.raises(InputError, match="tool results, not a user message"):
        TurnRequest(key=KEY, tool_results=(ToolResult(call_id="c", content="r"),)).text()
