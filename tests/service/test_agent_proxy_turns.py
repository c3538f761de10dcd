"""The OpenAI proxy's agent steps (requests with ``tools`` or tool results) run on the same turn
path as its chat turns: one turn per session at a time, ``Idempotency-Key`` replays, and every
outcome counted in the metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from contextmode.service import create_app
from contextmode.testing.models import BrokenStream, FunctionModel, ScriptedModel
from contextmode.types import ChatMessage, SessionKey
from tests.service.test_service import client_for, make_engine, make_settings, sse_events

TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {}}}}]
URL = "/v1/chat/completions"


def _step(content: str, session: str, *, stream: bool = False) -> dict[str, Any]:
    return {"model": "m", "user": session, "tools": TOOLS, "stream": stream,
            "messages": [{"role": "user", "content": content}]}


async def test_concurrent_agent_steps_of_one_session_do_not_interleave(tmp_path: Path) -> None:
    async def answer(messages: Sequence[ChatMessage]) -> list[str]:
        await asyncio.sleep(0.02)
        return ["answer to ", next(m.content for m in reversed(messages) if m.role == "user")]

    engine = make_engine(FunctionModel(answer))
    app = create_app(engine, make_settings(tmp_path, session_wait_ms=60_000))
    sent = [f"step {i}" for i in range(6)]
    async with client_for(app) as client:
        replies = await asyncio.gather(
            *(client.post(URL, json=_step(m, "agent-serial", stream=i % 2 == 0)) for i, m in enumerate(sent))
        )
    assert [r.status_code for r in replies] == [200] * 6
    turns = await engine.store.turns(SessionKey("local", "agent-serial"))
    assert [t.role for t in turns] == ["user", "assistant"] * 6
    for question, reply in zip(turns[::2], turns[1::2], strict=True):
        assert reply.content == f"answer to {question.content}"
    assert sorted(t.content for t in turns[::2]) == sorted(sent)
    await engine.close()


async def test_a_retried_agent_step_replays_without_a_second_turn(tmp_path: Path) -> None:
    model = FunctionModel(lambda messages: "一次")
    engine = make_engine(model)
    async with client_for(create_app(engine, make_settings(tmp_path))) as client:
        for stream, key in ((False, "k-whole"), (True, "k-stream")):
            body = _step(f"用工具 {key}", "agent-idem", stream=stream)
            first = await client.post(URL, json=body, headers={"Idempotency-Key": key})
            again = await client.post(URL, json=body, headers={"Idempotency-Key": key})
            assert first.status_code == again.status_code == 200
            assert again.headers["idempotent-replayed"] == "true"
            if stream:
                assert sse_events(again.text) == sse_events(first.text)
                assert sse_events(first.text)[-1] == "[DONE]"
            else:
                assert again.json() == first.json()
                assert first.json()["choices"][0]["message"]["content"] == "一次"
        changed = await client.post(URL, json=_step("别的", "agent-idem"), headers={"Idempotency-Key": "k-whole"})
        assert changed.status_code == 409 and changed.json()["error"]["contextmode_code"] == 40903
    assert len(model.calls) == 2
    assert [t.role for t in await engine.store.turns(SessionKey("local", "agent-idem"))] == ["user", "assistant"] * 2
    await engine.close()


async def test_agent_step_outcomes_are_counted(tmp_path: Path) -> None:
    model = ScriptedModel(["好", BrokenStream(chunks=["断"]), BrokenStream(chunks=["半"]), "流"])
    engine = make_engine(model)
    async with client_for(create_app(engine, make_settings(tmp_path))) as client:
        ok = await client.post(URL, json=_step("a", "agent-count"))
        broken_stream = await client.post(URL, json=_step("b", "agent-count", stream=True))
        broken_whole = await client.post(URL, json=_step("c", "agent-count"))
        streamed = await client.post(URL, json=_step("d", "agent-count", stream=True))
        await engine.drain()
        text = (await client.get("/metrics")).text
    assert ok.status_code == 200 and streamed.status_code == 200
    assert "error" in sse_events(broken_stream.text)[-2]
    assert broken_whole.status_code >= 500
    assert 'contextmode_turns_total{mode="contextual",outcome="ok"} 2.0' in text
    assert 'contextmode_turns_total{mode="contextual",outcome="error"} 2.0' in text
    assert "contextmode_active_streams 0.0" in text
    await engine.close()
