"""Kept per-turn traces: numbering by exchange, what the model received, retention, the route."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from contextmode.errors import EmptyMessage, ModelUnavailable, StoreError
from contextmode.store import MemoryStore
from contextmode.store.base import LockHandle, load_trace
from contextmode.store.lifecycle import DeletionRecord, Scope
from contextmode.store.records import (
    TurnTrace,
    cap_trace,
    message_to_dict,
    trace_from_json,
    trace_to_dict,
    trace_to_json,
)
from contextmode.testing.models import BrokenStream, FunctionModel
from contextmode.types import ChatMessage, SessionKey
from tests.service.test_service import assert_error, client_for, make_engine, make_settings

pytest.importorskip("fastapi")

from contextmode.service import create_app


def answer(messages: Sequence[ChatMessage]) -> str:
    return f"答：{messages[-1].content[:10]}"


async def test_each_exchange_keeps_exactly_what_the_model_received() -> None:
    model = FunctionModel(answer)
    engine = make_engine(model)
    for text in ("我不吃辣", "推荐一家餐厅", "它在哪里？", "举个例子"):
        await engine.turn("local", "s", text)
    await engine.drain()
    turns = await engine.store.turns(SessionKey("local", "s"))
    assert [t.metadata.get("turn") for t in turns] == [1, 1, 2, 2, 3, 3, 4, 4]
    for number, call in enumerate(model.calls, start=1):
        trace = await load_trace(engine.store, SessionKey("local", "s"), number)
        assert trace.turn == number
        assert tuple(trace.messages) == call.messages
        assert trace.user_seq == 2 * number - 1 and trace.answer_seq == 2 * number
        assert trace.model == "function-model"
        assert trace.layers and trace.total_tokens > 0
        assert {"detector", "rewriter", "counter"} <= set(trace.processors)
    third = await load_trace(engine.store, SessionKey("local", "s"), 3)
    assert third.typed == "它在哪里？"
    # The test rewriter names the last user turn; in contextual mode the model got the user's
    # words and the verified rewrite only as a hint, and the trace says so.
    assert third.rewrite is not None and third.rewrite.changed
    assert third.sent == third.typed != third.rewrite.text
    assert third.rewrite.decision == "hint" and third.follow_up is None
    # A follow-up answered from the last answer is a template expansion, not a rewrite.
    fourth = await load_trace(engine.store, SessionKey("local", "s"), 4)
    assert fourth.rewrite is None and fourth.follow_up == "example"
    assert fourth.typed == "举个例子" and fourth.sent != fourth.typed


async def test_numbering_survives_records_and_older_unnumbered_turns() -> None:
    engine = make_engine()
    await engine.record("local", "s", "user", "导入的第一句")
    await engine.record("local", "s", "assistant", "导入的回答")
    result = await engine.turn("local", "s", "第二句")
    assert result.user_turn.metadata["turn"] == 2
    # A session written before numbering existed is counted once, then continues from the stamps.
    from contextmode.types import NewTurn

    await engine.store.append(
        SessionKey("local", "old"), [NewTurn(role=r, content=c, tokens=2) for r, c in [("user", "一"), ("assistant", "二")] * 3]
    )
    assert (await engine.turn("local", "old", "第四句")).user_turn.metadata["turn"] == 4
    assert (await engine.turn("local", "old", "第五句")).user_turn.metadata["turn"] == 5
    await engine.drain()


async def test_retention_size_cap_and_off_switch() -> None:
    engine = make_engine(trace_keep=2)
    for text in ("一", "二", "三"):
        await engine.turn("local", "s", text)
    store = engine.store
    assert isinstance(store, MemoryStore)
    assert await store.get_trace(SessionKey("local", "s"), 1) is None
    assert (await store.get_trace(SessionKey("local", "s"), 3)) is not None

    off = make_engine(trace_keep=0)
    await off.turn("local", "s", "一")
    assert await off.store.get_trace(SessionKey("local", "s"), 1) is None  # type: ignore[attr-defined]

    capped = make_engine(trace_max_bytes=2000)
    await capped.turn("local", "s", "长" * 5000)
    kept = await capped.store.get_trace(SessionKey("local", "s"), 1)  # type: ignore[attr-defined]
    assert kept is not None and kept.cut
    assert len(trace_to_json(kept).encode()) <= 2000
    await engine.drain(), await off.drain(), await capped.drain()


async def test_a_broken_stream_still_keeps_the_trace_marked_partial() -> None:
    engine = make_engine(FunctionModel(lambda m: BrokenStream(chunks=["半句"], error=ModelUnavailable("down"))))
    with pytest.raises(ModelUnavailable):
        await engine.turn("local", "s", "你好")
    trace = await load_trace(engine.store, SessionKey("local", "s"), 1)
    assert trace.partial and trace.answer_seq == 2
    await engine.drain()


def test_codec_round_trip_and_cap_leave_short_traces_alone() -> None:
    async def one() -> Any:
        engine = make_engine()
        await engine.turn("local", "s", "我不吃辣")
        await engine.drain()
        return await load_trace(engine.store, SessionKey("local", "s"), 1)

    trace = asyncio.run(one())
    assert trace_from_json(trace_to_json(trace)) == trace
    assert cap_trace(trace, 1_000_000) is trace
    assert trace_to_dict(trace)["created_at"] == trace.created_at.isoformat()


async def test_empty_messages_are_refused_by_the_engine() -> None:
    engine = make_engine()
    for text in ("", "   ", "\n\t"):
        with pytest.raises(EmptyMessage):
            await engine.turn("local", "s", text)
    assert await engine.store.turns(SessionKey("local", "s")) == []


# -- HTTP ---------------------------------------------------------------------------------


async def test_route_returns_the_trace_tenant_scoped(tmp_path: Path) -> None:
    model = FunctionModel(answer)
    engine = make_engine(model)
    settings = make_settings(tmp_path, api_keys={"key-a": "acme", "key-b": "beta"})
    a = {"Authorization": "Bearer key-a"}
    b = {"Authorization": "Bearer key-b"}
    async with client_for(create_app(engine, settings)) as client:
        for text in ("我不吃辣", "推荐一家餐厅", "那家店在哪？"):
            r = await client.post("/v1/sessions/s/messages", json={"message": text}, headers=a)
            assert r.json()["code"] == 0
        r = await client.get("/v1/sessions/s/turns/2/context", headers=a)
        body = r.json()
        assert body["code"] == 0
        data = body["data"]
        assert data["turn"] == 2 and data["typed"] == "推荐一家餐厅"
        assert [message_to_dict(m) for m in model.calls[1].messages] == data["messages"]
        assert data == trace_to_dict(await load_trace(engine.store, SessionKey("acme", "s"), 2))
        assert_error(await client.get("/v1/sessions/s/turns/2/context", headers=b), 40401)
        assert_error(await client.get("/v1/sessions/s/turns/9/context", headers=a), 40402)
        assert_error(await client.get("/v1/sessions/s/turns/0/context", headers=a), 40001)
    await engine.drain()


async def test_input_rules_at_the_edge(tmp_path: Path) -> None:
    engine = make_engine()
    async with client_for(create_app(engine, make_settings(tmp_path))) as client:
        for text in ("", "   ", "\n"):
            body = assert_error(await client.post("/v1/sessions/s/messages", json={"message": text}), 40005)
            assert "empty" in body["msg"]
        for flag in ("true", 1, "yes", None):
            r = await client.post("/v1/sessions/s/messages", json={"message": "你好", "stream": flag})
            assert_error(r, 40001)
        proxy = {"model": "x", "messages": [{"role": "user", "content": "你好"}], "stream": "true"}
        r = await client.post("/v1/chat/completions", json=proxy)
        assert r.status_code == 400
        r = await client.post(
            "/v1/chat/completions", json={"model": "x", "messages": [{"role": "user", "content": "  "}]}
        )
        assert r.status_code == 400
    assert await engine.store.turns(SessionKey("local", "s")) == []


async def test_each_recalled_turn_says_why_in_the_trace_and_the_context(tmp_path: Path) -> None:
    from contextmode.memory.recall import Recaller
    from contextmode.service.schemas import ContextOut

    engine = make_engine(FunctionModel(answer), context_window=240)  # smaller than the conversation
    engine.recaller = Recaller()
    await engine.turn("local", "s", "My cat is called Whiskers and she sleeps on the piano")
    for i in range(8):
        await engine.turn("local", "s", f"Tell me about the weather in town number {i}")
    await engine.turn("local", "s", "Which instrument does my cat sleep on?")
    await engine.drain()
    trace = await load_trace(engine.store, SessionKey("local", "s"), 10)
    assert trace is not None
    hit = next(r for r in trace.recalled if r.seq == 1)
    assert hit.layer == "recall" and hit.ranker == "bm25"
    assert hit.score is not None and hit.score > 0
    assert {"cat", "sleep"} <= set(hit.matched) and "piano" not in hit.matched
    assert "My cat is called Whiskers" in hit.text
    assert trace_from_json(trace_to_json(trace)) == trace
    public = trace_to_dict(trace)["recalled"]
    assert public[[r["seq"] for r in public].index(1)]["matched"] == list(hit.matched)
    # The context the service shows for a message carries the same reasons (the score moved:
    # the session has one more exchange now).
    prepared = await engine.prepare("local", "s", "Which instrument does my cat sleep on?")
    shown = ContextOut.of(prepared, full=True).recalled
    mine = next(r for r in shown if r.seq == 1)
    assert (mine.matched, mine.ranker) == (list(hit.matched), "bm25") and (mine.score or 0) > 0
    assert mine.text is not None and ContextOut.of(prepared, full=False).recalled[0].text is None


# -- the trace is written just after the reply ---------------------------------------------


class HeldTraces(MemoryStore):
    """A store whose trace writes wait until ``release`` is set (a slow trace write).

    With ``racy`` the write checks the session first and writes after the wait without
    checking again, as a PostgreSQL ``INSERT … SELECT`` racing an erase does: a write left
    to finish after an erasure would bring the trace back.
    """

    def __init__(self, *, racy: bool = False) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.racy = racy
        self.late: dict[tuple[str, str, int], TurnTrace] = {}
        self.erasing = asyncio.Event()
        """Set when an erasure has opened its deletion record."""

    async def put_trace(
        self, key: SessionKey, trace: TurnTrace, *, keep: int = 0, older_than: datetime | None = None
    ) -> None:
        if not self.racy:
            await self.release.wait()
            await super().put_trace(key, trace, keep=keep, older_than=older_than)
            return
        if await self.info(key) is None:
            return
        await self.release.wait()
        self.late[(key.tenant, key.session_id, trace.turn)] = trace

    async def get_trace(self, key: SessionKey, turn: int) -> TurnTrace | None:
        late = self.late.get((key.tenant, key.session_id, turn))
        return late if late is not None else await super().get_trace(key, turn)

    async def open_deletion(self, tenant: str, scope: Scope, target: str, *, actor: str) -> DeletionRecord:
        self.erasing.set()
        return await super().open_deletion(tenant, scope, target, actor=actor)

    async def erase_session(self, session_key: SessionKey, *, record_id: int | None = None) -> dict[str, int]:
        for key in [k for k in self.late if k[:2] == (session_key.tenant, session_key.session_id)]:
            del self.late[key]
        return await super().erase_session(session_key, record_id=record_id)


async def test_the_reply_does_not_wait_for_the_trace_and_a_read_right_after_waits_for_it(tmp_path: Path) -> None:
    store = HeldTraces()
    model = FunctionModel(answer)
    engine = make_engine(model, store=store)
    async with client_for(create_app(engine, make_settings(tmp_path))) as client:
        # The trace write is held: the reply still comes (it would never come if it waited).
        r = await asyncio.wait_for(client.post("/v1/sessions/s/messages", json={"message": "我不吃辣"}), 30)
        assert r.json()["code"] == 0 and r.json()["data"]["turn"] == 1
        assert engine.trace_writes.pending("local", "s")
        assert await store.get_trace(SessionKey("local", "s"), 1) is None
        read = asyncio.create_task(client.get("/v1/sessions/s/turns/1/context"))
        direct = asyncio.create_task(engine.trace(SessionKey("local", "s"), 1))
        await asyncio.sleep(0.05)
        assert not read.done() and not direct.done()  # both wait for the write, none answers 40402
        store.release.set()
        body = (await read).json()
        assert body["code"] == 0 and body["data"]["typed"] == "我不吃辣"
        assert [message_to_dict(m) for m in model.calls[0].messages] == body["data"]["messages"]
        assert (await direct).turn == 1
    assert not engine.trace_writes.pending("local", "s")
    await engine.drain()


async def test_drain_and_close_wait_for_pending_trace_writes() -> None:
    store = HeldTraces()
    engine = make_engine(store=store)
    for text in ("一", "二", "三"):
        await engine.turn("local", "s", text)
    drained = asyncio.create_task(engine.drain())
    await asyncio.sleep(0.05)
    assert not drained.done()
    store.release.set()
    await drained
    assert [t.turn for t in [await load_trace(store, SessionKey("local", "s"), n) for n in (1, 2, 3)]] == [1, 2, 3]

    held = HeldTraces()
    closing = make_engine(store=held)
    await closing.turn("local", "s", "一")
    closed = asyncio.create_task(closing.close())
    await asyncio.sleep(0.05)
    assert not closed.done()
    held.release.set()
    await closed
    assert await held.get_trace(SessionKey("local", "s"), 1) is not None


async def test_a_forget_waits_for_the_pending_trace_so_it_never_comes_back(tmp_path: Path) -> None:
    store = HeldTraces(racy=True)
    engine = make_engine(store=store)
    async with client_for(create_app(engine, make_settings(tmp_path))) as client:
        r = await client.post("/v1/sessions/s/messages", json={"message": "我不吃辣"})
        assert r.json()["code"] == 0
        assert engine.trace_writes.pending("local", "s")
        deleting = asyncio.create_task(client.delete("/v1/sessions/s"))
        await store.erasing.wait()
        for _ in range(50):  # an erasure that did not wait would be done by now (nothing here sleeps)
            await asyncio.sleep(0)
        store.release.set()  # the write finishes; the erase must come after it
        assert (await deleting).json()["code"] == 0
        await engine.drain()  # every write has ended: none came after the erasure
        assert await store.get_trace(SessionKey("local", "s"), 1) is None
        assert_error(await client.get("/v1/sessions/s/turns/1/context"), 40401)
    await engine.drain()


async def test_a_turn_whose_trace_was_not_written_says_so(tmp_path: Path) -> None:
    class LostTraces(MemoryStore):
        """The process stopped between the reply and the trace write."""

        async def put_trace(
            self, key: SessionKey, trace: TurnTrace, *, keep: int = 0,
            older_than: datetime | None = None,
        ) -> None:
            raise StoreError("gone")

    engine = make_engine(store=LostTraces())
    async with client_for(create_app(engine, make_settings(tmp_path))) as client:
        r = await client.post("/v1/sessions/s/messages", json={"message": "我不吃辣"})
        assert r.json()["code"] == 0
        body = assert_error(await client.get("/v1/sessions/s/turns/1/context"), 40402)
        assert "just after the reply" in body["msg"]
    assert [t.role for t in await engine.store.turns(SessionKey("local", "s"))] == ["user", "assistant"]
    await engine.drain()


async def test_the_service_writes_the_trace_once_the_turn_lock_is_released(tmp_path: Path) -> None:
    class Recording(MemoryStore):
        """Notes, at each trace write, whether the session's turn lock is held."""

        def __init__(self) -> None:
            super().__init__()
            self.turn_running = False
            self.lock_held_at_write: list[bool] = []

        def turn_lock(
            self, key: SessionKey, *, ttl_s: float = 300.0
        ) -> AbstractAsyncContextManager[LockHandle]:
            inner = super().turn_lock(key, ttl_s=ttl_s)

            @asynccontextmanager
            async def tracked() -> AsyncIterator[LockHandle]:
                async with inner as handle:
                    self.turn_running = True
                    try:
                        yield handle
                    finally:
                        self.turn_running = False

            return tracked()

        async def put_trace(
            self, key: SessionKey, trace: TurnTrace, *, keep: int = 0,
            older_than: datetime | None = None,
        ) -> None:
            self.lock_held_at_write.append(self.turn_running)
            await super().put_trace(key, trace, keep=keep, older_than=older_than)

    store = Recording()
    engine = make_engine(store=store)
    async with client_for(create_app(engine, make_settings(tmp_path))) as client:
        assert (await client.post("/v1/sessions/s/messages", json={"message": "我不吃辣"})).json()["code"] == 0
        streamed = await client.post("/v1/sessions/s/messages", json={"message": "推荐一家餐厅", "stream": True})
        assert "done" in streamed.text
        for turn in (1, 2):
            assert (await client.get(f"/v1/sessions/s/turns/{turn}/context")).json()["data"]["turn"] == turn
    await engine.drain()
    # Written after each reply's own store calls, never inside the turn.
    assert store.lock_held_at_write == [False, False]


async def test_storage_route_gives_the_bytes_by_kind_as_the_cli_does(tmp_path: Path) -> None:
    """``GET /v1/sessions/{id}/storage``: the figures ``contextmode stats`` prints (one
    function, `store.usage.session_storage`), tenant-scoped; a store that does not report
    its size says so in one line."""
    from contextmode.cli.stats import session_stats
    from contextmode.store import SQLiteStore

    url = f"sqlite:///{tmp_path / 'usage.db'}"
    engine = make_engine(FunctionModel(answer), store=SQLiteStore(tmp_path / "usage.db"))
    settings = make_settings(tmp_path, api_keys={"key-a": "acme", "key-b": "beta"})
    a = {"Authorization": "Bearer key-a"}
    async with client_for(create_app(engine, settings)) as client:
        for text in ("我不吃辣", "推荐一家餐厅", "那家店在哪？"):
            assert (await client.post("/v1/sessions/s/messages", json={"message": text}, headers=a)).json()["code"] == 0
        await engine.drain()
        r = await client.get("/v1/sessions/s/storage", headers=a)
        data = r.json()["data"]
        assert data["exchanges"] == 3 and data["total_bytes"] == sum(data["bytes"].values())
        assert data["bytes"]["traces"] > 0 and data["bytes"]["turns"] >= data["raw_text_bytes"] > 0
        assert list(data["bytes"].values()) == sorted(data["bytes"].values(), reverse=True)
        assert_error(await client.get("/v1/sessions/s/storage", headers={"Authorization": "Bearer key-b"}), 40401)
    await engine.close()
    cli = await session_stats(url, "acme", "s")
    assert cli.pop("session") == data.pop("session_id") == "s" and cli == data
    memory = make_engine(FunctionModel(answer))
    async with client_for(create_app(memory, make_settings(tmp_path))) as client:
        await client.post("/v1/sessions/s/messages", json={"message": "你好"})
        body = assert_error(await client.get("/v1/sessions/s/storage"), 40001)
        assert "does not report its size" in body["msg"]
