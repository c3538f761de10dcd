"""One typed turn: a TurnRequest checked once at the edge, the engine's event union, per-turn
options by value, the sync stream, job hooks and driver errors mapped by table."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from contextmode import ContextMode
from contextmode.engine import USE_DEFAULT, Delta, Done, Failed, Prepared, TurnRequest
from contextmode.errors import EmptyMessage, InvalidSessionId, ModelError, StoreError, translate
from contextmode.jobs import JobRunner, JobSettings
from contextmode.store._driver_errors import asyncpg_errors, redis_errors
from contextmode.testing.models import BrokenStream, FunctionModel, ScriptedModel
from contextmode.types import ChatMessage, ImageRef, SessionKey
from tests.engine.test_engine import echo, make_engine


def test_a_request_is_checked_when_it_is_made() -> None:
    with pytest.raises(InvalidSessionId):
        SessionKey("t", "no spaces allowed")
    with pytest.raises(InvalidSessionId):
        SessionKey("", "s")
    key = SessionKey("t", "s")
    with pytest.raises(EmptyMessage):
        TurnRequest(key=key, message="   ")
    with pytest.raises(InvalidSessionId, match="user id"):
        TurnRequest(key=key, message="hi", user_id="bad user")
    request = TurnRequest(key=key, message="hi", metadata={"a": 1},
                          images=[ImageRef(path="/tmp/x.png", type="image/png", bytes=3)])
    with pytest.raises(TypeError):
        request.metadata["a"] = 2  # type: ignore[index]
    assert request.turn_metadata() == {
        "a": 1, "image_count": 1, "images": [{"path": "/tmp/x.png", "type": "image/png", "bytes": 3}],
    }


async def test_stream_yields_prepared_deltas_then_done() -> None:
    engine = make_engine(FunctionModel(echo))
    events = [e async for e in engine.stream(TurnRequest(key=SessionKey("t", "s"), message="你好呀"))]
    assert isinstance(events[0], Prepared) and isinstance(events[-1], Done)
    assert all(isinstance(e, Delta) for e in events[1:-1])
    done = events[-1]
    assert isinstance(done, Done)
    assert done.text == "".join(e.text for e in events[1:-1] if isinstance(e, Delta)) == done.result.answer
    assert done.result.assistant_turn is not None and done.result.assistant_turn.content == done.result.answer
    await engine.close()


async def test_the_user_turn_is_stored_before_prepared_and_a_stream_closed_there_schedules_its_jobs() -> None:
    """The user turn is stored with the ``Prepared`` event (on the connection preparing used);
    a stream closed right then calls no model, stores no answer and still schedules the
    turn's jobs, as a stream cut before its first token does."""
    model = FunctionModel(echo)
    engine = make_engine(model)
    stream = engine.stream(TurnRequest(key=SessionKey("t", "s"), message="你好呀"))
    first = await anext(stream)
    assert isinstance(first, Prepared)
    assert [t.content for t in await engine.store.turns(SessionKey("t", "s"))] == ["你好呀"]
    assert engine.jobs.pending("t", "s") == []
    await stream.aclose()  # type: ignore[attr-defined]
    assert model.calls == []
    assert [t.role for t in await engine.store.turns(SessionKey("t", "s"))] == ["user"]
    assert engine.jobs.pending("t", "s") == ["memory"]  # the session's one unit: emotion, constraints
    await engine.close()


async def test_a_model_failure_ends_the_stream_with_failed_after_storing_the_partial() -> None:
    engine = make_engine(ScriptedModel([BrokenStream(chunks=["一半", "的回答"])]))
    events = [e async for e in engine.stream(TurnRequest(key=SessionKey("t", "s"), message="讲个故事"))]
    assert [e.kind for e in events] == ["prepared", "delta", "delta", "failed"]
    failed = events[-1]
    assert isinstance(failed, Failed) and isinstance(failed.error, ModelError)
    assert failed.partial_answer == "一半的回答"
    turns = (await engine.store.load(SessionKey("t", "s"))).turns
    assert [t.content for t in turns] == ["讲个故事", "一半的回答"] and turns[1].partial
    await engine.close()


async def test_a_system_prompt_for_one_turn_leaves_the_engine_alone() -> None:
    seen: list[str] = []

    def model(messages: Sequence[ChatMessage]) -> list[str]:
        seen.append(messages[0].content)
        return ["ok"]

    engine = make_engine(FunctionModel(model))
    engine.system_prompt = "ENGINE PROMPT"
    key = SessionKey("t", "s")
    await engine.turn(TurnRequest(key=key, message="one", system_prompt="TURN PROMPT"))
    await engine.turn(TurnRequest(key=key, message="two"))
    await engine.turn(TurnRequest(key=key, message="three", system_prompt=USE_DEFAULT))
    assert "TURN PROMPT" in seen[0] and "ENGINE PROMPT" not in seen[0]
    assert all("ENGINE PROMPT" in s and "TURN PROMPT" not in s for s in seen[1:])
    assert engine.system_prompt == "ENGINE PROMPT"
    await engine.close()


def test_contextmode_sync_stream_yields_text_and_a_broken_off_stream_stores_the_partial() -> None:
    model = ScriptedModel([["第一段", "第二段"], ["甲", "乙", "丙"]])
    with ContextMode(store="memory://", model=model) as cm:
        assert list(cm.stream("s1", "说两段")) == ["第一段", "第二段"]
        for piece in cm.stream("s1", "说三段", metadata={"source": "test"}):
            assert piece == "甲"
            break  # the caller stops reading: the engine stores what arrived, marked partial
        turns = cm.turns("s1")
        assert [t.content for t in turns] == ["说两段", "第一段第二段", "说三段", "甲"]
        assert turns[-1].partial and turns[2].metadata["source"] == "test"
        with pytest.raises(InvalidSessionId):
            cm.chat("bad id", "hi")
        with pytest.raises(TypeError):
            cm.chat("s1", "hi", modes="decoupled")  # type: ignore[call-arg]


async def test_job_hooks_hear_of_scheduled_jobs_and_failed_attempts() -> None:
    class Hooks:
        def __init__(self) -> None:
            self.scheduled: list[str] = []
            self.failed: list[str] = []

        def job_scheduled(self, job: str) -> None:
            self.scheduled.append(job)

        def job_failed(self, job: str) -> None:
            self.failed.append(job)

    hooks = Hooks()
    runner = JobRunner(settings=JobSettings(attempts=2, base_delay_s=0), hooks=hooks)
    outcomes = iter([RuntimeError("429"), None])

    async def flaky() -> None:
        if (exc := next(outcomes)) is not None:
            raise exc

    async def fine() -> None:
        await asyncio.sleep(0)

    runner.schedule("t", "s", "summary", flaky)
    runner.schedule("t", "s", "emotion", fine)
    await runner.drain()
    assert hooks.scheduled == ["summary", "emotion"]
    assert hooks.failed == ["summary"]  # the first attempt failed; the retry succeeded


def test_driver_errors_map_to_store_error_by_table() -> None:
    import asyncpg.exceptions as pg
    import redis.exceptions as rd

    assert isinstance(translate(pg.ConnectionDoesNotExistError("gone"), asyncpg_errors(), "pg"), StoreError)
    assert isinstance(translate(pg.UniqueViolationError("dup"), asyncpg_errors(), "pg"), StoreError)
    assert isinstance(translate(rd.ConnectionError("refused"), redis_errors(), "redis"), StoreError)
    assert isinstance(translate(ConnectionRefusedError(), redis_errors(), "redis"), StoreError)
    assert translate(KeyError("a bug"), asyncpg_errors(), "pg") is None  # a bug stays a bug
