"""Tool calls and results are typed fields of a turn, end to end: the engine makes them typed,
the stores keep them in the same JSON as before, and what was stored or exported before the
fields existed reads back typed."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from contextmode import EngineSettings, build_engine
from contextmode.engine import TurnRequest
from contextmode.lifecycle.export import export_records, import_records
from contextmode.store.memory import MemoryStore
from contextmode.store.sqlite import SQLiteStore
from contextmode.testing.models import FunctionModel
from contextmode.types import (
    TOOL_KEYS,
    NewTurn,
    SessionKey,
    ToolCall,
    ToolResult,
    Turn,
    tool_metadata,
)

CALLS = (ToolCall(id="call_1", name="search", arguments='{"q": "里斯本"}'), ToolCall(id="call_2", name="read_file"))
STORED_CALLS = [{"id": "call_1", "name": "search", "arguments": '{"q": "里斯本"}'},
                {"id": "call_2", "name": "read_file", "arguments": "{}"}]


def agent_turns() -> list[NewTurn]:
    return [
        NewTurn(role="user", content="find flights", tokens=2),
        NewTurn(role="assistant", content="", tokens=30, tool_calls=CALLS, metadata={"model": "m"}),
        NewTurn(role="tool", content='{"price": 120}', tokens=5, tool_call_id="call_1", tool_name="search"),
    ]


def test_typed_fields_and_their_stored_form_agree() -> None:
    new = NewTurn(role="assistant", content="", tokens=1, tool_calls=CALLS, metadata={"model": "m"})
    assert dict(new.metadata) == {"model": "m", "tool_calls": STORED_CALLS}
    # The stored form read back (a store's row, an export line) gives the typed fields.
    read = Turn(seq=2, role="assistant", content="", tokens=1, created_at=new.created_at, metadata=new.metadata)
    assert read.tool_calls == CALLS and read.tool_call_id is None
    assert read == Turn(seq=2, role="assistant", content="", tokens=1, created_at=new.created_at,
                        metadata={"model": "m"}, tool_calls=CALLS)
    # The typed value wins, and clearing it clears the stored form.
    plain = replace(read, tool_calls=(), metadata={"model": "m"})
    assert plain.tool_calls == () and not TOOL_KEYS & set(plain.metadata)
    result = NewTurn(role="tool", content="x", tokens=1, tool_call_id="call_1", tool_name="search")
    assert dict(result.metadata) == tool_metadata(tool_call_id="call_1", tool_name="search")


async def test_sqlite_keeps_the_same_json_and_reads_old_rows_typed(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = SQLiteStore(path)
    stored = await store.append(SessionKey("t", "s"), agent_turns())
    assert stored[1].tool_calls == CALLS and stored[2].tool_call_id == "call_1"
    await store.close()
    db = sqlite3.connect(path)
    rows = [json.loads(m) for (m,) in db.execute("SELECT metadata FROM turns ORDER BY seq")]
    # On disk: the shape every earlier version wrote (the agent keys in the turn's JSON metadata).
    assert rows[1] == {"model": "m", "tool_calls": STORED_CALLS}
    assert rows[2] == {"tool_call_id": "call_1", "tool_name": "search"}
    # A row as an older version wrote it, appended by hand: read back typed.
    db.execute("UPDATE turns SET metadata = ? WHERE seq = 3",
               (json.dumps({"tool_call_id": "call_9", "tool_name": "old"}),))
    db.commit()
    db.close()
    store = SQLiteStore(path)
    turns = await store.turns(SessionKey("t", "s"))
    assert turns[1].tool_calls == CALLS
    assert (turns[2].tool_call_id, turns[2].tool_name) == ("call_9", "old")
    await store.close()


async def _lines(records: list[Mapping[str, Any]]) -> AsyncIterator[Mapping[str, Any]]:
    for record in records:
        yield record


async def test_an_export_keeps_its_lines_and_imports_typed() -> None:
    source = MemoryStore()
    await source.append(SessionKey("t", "s"), agent_turns())
    records = [r async for r in export_records(source)]
    turn_lines = [r for r in records if r.get("type") == "turn"]
    assert turn_lines[1]["metadata"] == {"model": "m", "tool_calls": STORED_CALLS}
    assert turn_lines[2]["metadata"] == {"tool_call_id": "call_1", "tool_name": "search"}
    target = MemoryStore()
    await import_records(target, _lines(records))
    turns = await target.turns(SessionKey("t", "s"))
    assert turns[1].tool_calls == CALLS and (turns[2].tool_call_id, turns[2].tool_name) == ("call_1", "search")


async def test_an_agent_step_stores_typed_calls_and_results() -> None:
    def answer(messages: object) -> list[str]:
        return ["done"]

    engine = build_engine(store=MemoryStore(), model=FunctionModel(answer))
    key = SessionKey("t", "s")
    await engine.store.append(SessionKey("t", "s"), [NewTurn(role="user", content="look", tokens=1),
                                         NewTurn(role="assistant", content="", tokens=3, tool_calls=CALLS)])
    request = TurnRequest(key=key, tool_results=(ToolResult(call_id="call_2", content="a file"),))
    events = [e async for e in engine.stream(request)]
    assert events[-1].kind == "done"
    turns = await engine.store.turns(SessionKey("t", "s"))
    assert [(t.role, t.tool_call_id, t.tool_name) for t in turns[2:]] == [
        ("tool", "call_2", "read_file"), ("assistant", None, None)]
    await engine.close()


async def test_masking_reaches_the_typed_call_arguments() -> None:
    engine = build_engine(store=MemoryStore(), model=FunctionModel(lambda m: ["ok"]), settings=EngineSettings(pii="mask"))
    call = ToolCall(id="c", name="mail", arguments='{"to": "zhang.wei@example.com"}')
    kept = engine.keepable("t", [NewTurn(role="assistant", content="", tokens=3, tool_calls=(call,))])[0]
    assert "zhang.wei@example.com" not in kept.tool_calls[0].arguments
    assert kept.metadata["tool_calls"][0]["arguments"] == kept.tool_calls[0].arguments
    assert json.loads(kept.tool_calls[0].arguments)["to"] != "zhang.wei@example.com"
    await engine.close()
