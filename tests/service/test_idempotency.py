"""Idempotency-Key: a retry replays the first result, a changed body is refused, keys are per tenant;
and concurrent turns of one session run one at a time (in one process, any store)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from contextmode.service import ServiceSettings, create_app
from contextmode.store.memory import MemoryStore
from contextmode.store.sqlite import SQLiteStore
from contextmode.types import ChatMessage, SessionKey
from tests.service.test_service import SlowModel, client_for, make_engine, make_settings, sse_events

SID = "idem-1"
URL = f"/v1/sessions/{SID}/messages"


def _roles(turns: Sequence[Any]) -> list[str]:
    return [t.role for t in turns]


async def test_same_key_and_body_replays_and_stores_once(tmp_path: Path) -> None:
    engine = make_engine()
    async with client_for(create_app(engine, make_settings(tmp_path))) as client:
        first = await client.post(URL, json={"message": "hello"}, headers={"Idempotency-Key": "k-1"})
        again = await client.post(URL, json={"message": "hello"}, headers={"Idempotency-Key": "k-1"})
        assert first.status_code == again.status_code == 200
        assert again.json() == first.json()
        assert again.headers["idempotent-replayed"] == "true"
        assert "idempotent-replayed" not in first.headers
        assert _roles(await engine.store.turns(SessionKey("local", SID))) == ["user", "assistant"]
        # Without a key, or with a new one, it is a new turn.
        await client.post(URL, json={"message": "hello"})
        await client.post(URL, json={"message": "hello"}, headers={"Idempotency-Key": "k-2"})
        assert len(await engine.store.turns(SessionKey("local", SID))) == 6


async def test_same_key_with_another_body_or_session_is_40903(tmp_path: Path) -> None:
    engine = make_engine()
    async with client_for(create_app(engine, make_settings(tmp_path))) as client:
        await client.post(URL, json={"message": "hello"}, headers={"Idempotency-Key": "k"})
        changed = await client.post(URL, json={"message": "hello!"}, headers={"Idempotency-Key": "k"})
        assert changed.status_code == 409 and changed.json()["code"] == 40903
        elsewhere = await client.post(
            "/v1/sessions/other/messages", json={"message": "hello"}, headers={"Idempotency-Key": "k"}
        )
        assert elsewhere.json()["code"] == 40903
        assert len(await engine.store.turns(SessionKey("local", SID))) == 2
        assert await engine.store.info(SessionKey("local", "other")) is None


async def test_keys_are_per_tenant(tmp_path: Path) -> None:
    engine = make_engine()
    settings = make_settings(tmp_path, api_keys={"key-a": "tenant-a", "key-b": "tenant-b"})
    async with client_for(create_app(engine, settings)) as client:
        for key in ("key-a", "key-b"):
            r = await client.post(
                URL, json={"message": "hi"}, headers={"Idempotency-Key": "same", "Authorization": f"Bearer {key}"}
            )
            assert r.status_code == 200 and "idempotent-replayed" not in r.headers
        for tenant in ("tenant-a", "tenant-b"):
            assert len(await engine.store.turns(SessionKey(tenant, SID))) == 2


async def test_a_running_request_answers_40904_and_a_failed_one_frees_its_key(tmp_path: Path) -> None:
    engine = make_engine(SlowModel(["slow ", "answer"], delay_s=0.2))
    async with client_for(create_app(engine, make_settings(tmp_path))) as client:
        headers = {"Idempotency-Key": "k-run"}
        first = asyncio.create_task(client.post(URL, json={"message": "hello"}, headers=headers))
        await asyncio.sleep(0.1)
        during = await client.post(URL, json={"message": "hello"}, headers=headers)
        assert during.status_code == 409 and during.json()["code"] == 40904
        assert (await first).status_code == 200
        # A request refused before anything was stored does not keep its key.
        bad = await client.post(URL, json={"message": "x\x00"}, headers={"Idempotency-Key": "k-bad"})
        assert bad.json()["code"] == 40001
        ok = await client.post(URL, json={"message": "fixed"}, headers={"Idempotency-Key": "k-bad"})
        assert ok.status_code == 200
        assert len(await engine.store.turns(SessionKey("local", SID))) == 4
        # Nor does one whose image is refused: the retry with a good body runs at once (no 40904).
        image = {"message": "look", "images": ["data:image/png;base64,@@@@"]}
        refused = await client.post(URL, json=image, headers={"Idempotency-Key": "k-img"})
        assert refused.status_code == 400
        retry = await client.post(URL, json={"message": "look"}, headers={"Idempotency-Key": "k-img"})
        assert retry.status_code == 200, retry.json()
        assert len(await engine.store.turns(SessionKey("local", SID))) == 6


async def test_a_stream_is_replayed_as_a_stream(tmp_path: Path) -> None:
    engine = make_engine()
    async with client_for(create_app(engine, make_settings(tmp_path))) as client:
        body = {"message": "hello", "stream": True}
        first = await client.post(URL, json=body, headers={"Idempotency-Key": "s"})
        again = await client.post(URL, json=body, headers={"Idempotency-Key": "s"})
        assert again.headers["content-type"].startswith("text/event-stream")
        assert sse_events(again.text) == sse_events(first.text)
        assert len(await engine.store.turns(SessionKey("local", SID))) == 2


async def test_the_proxy_honours_the_key(tmp_path: Path) -> None:
    engine = make_engine()
    body = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "user": SID}
    async with client_for(create_app(engine, make_settings(tmp_path))) as client:
        first = await client.post("/v1/chat/completions", json=body, headers={"Idempotency-Key": "p"})
        again = await client.post("/v1/chat/completions", json=body, headers={"Idempotency-Key": "p"})
        assert first.status_code == 200 and again.json() == first.json()
        changed = await client.post(
            "/v1/chat/completions", json={**body, "messages": [{"role": "user", "content": "bye"}]},
            headers={"Idempotency-Key": "p"},
        )
        assert changed.status_code == 409 and changed.json()["error"]["contextmode_code"] == 40903
        assert len(await engine.store.turns(SessionKey("local", SID))) == 2


async def test_a_retry_after_a_worker_restart_replays(tmp_path: Path) -> None:
    path = tmp_path / "cm.db"
    headers = {"Idempotency-Key": "restart"}
    engine = make_engine(store=SQLiteStore(path))
    async with client_for(create_app(engine, make_settings(tmp_path))) as client:
        first = await client.post(URL, json={"message": "hello"}, headers=headers)
    await engine.close()
    await engine.store.close()
    engine = make_engine(store=SQLiteStore(path))
    async with client_for(create_app(engine, make_settings(tmp_path))) as client:
        again = await client.post(URL, json={"message": "hello"}, headers=headers)
        assert again.json() == first.json() and again.headers["idempotent-replayed"] == "true"
        assert len(await engine.store.turns(SessionKey("local", SID))) == 2
    await engine.close()
    await engine.store.close()


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_concurrent_turns_of_one_session_are_serialised(tmp_path: Path, kind: str) -> None:
    store = MemoryStore() if kind == "memory" else SQLiteStore(tmp_path / "serial.db")

    async def answer(messages: Sequence[ChatMessage]) -> Any:
        await asyncio.sleep(0.02)
        return ["answer to ", messages[-1].content]

    class Model:
        name = "serial"

        async def stream(self, messages: Sequence[ChatMessage], *, max_tokens: int | None = None) -> Any:
            for piece in await answer(messages):
                yield piece

        async def complete(self, messages: Sequence[ChatMessage], *, max_tokens: int | None = None) -> str:
            return "".join(await answer(messages))

    engine = make_engine(Model(), store=store)
    settings = make_settings(tmp_path, session_wait_ms=60_000)
    async with client_for(create_app(engine, settings)) as client:
        sent = [f"message {i}" for i in range(8)]
        replies = await asyncio.gather(
            *(client.post(URL, json={"message": m, "stream": i % 2 == 0}) for i, m in enumerate(sent))
        )
        assert all(r.status_code == 200 for r in replies)
    turns = await store.turns(SessionKey("local", SID))
    assert _roles(turns) == ["user", "assistant"] * 8
    for question, reply in zip(turns[::2], turns[1::2], strict=True):
        assert reply.metadata["reply_to"] == question.seq
        assert reply.content == f"answer to {question.content}"
    assert sorted(t.content for t in turns[::2]) == sorted(sent)
    await engine.close()
    await store.close()


async def test_a_session_busy_past_the_wait_is_40902(tmp_path: Path) -> None:
    engine = make_engine(SlowModel(["a", "b"], delay_s=0.3))
    async with client_for(create_app(engine, make_settings(tmp_path, session_wait_ms=50))) as client:
        first = asyncio.create_task(client.post(URL, json={"message": "one"}))
        await asyncio.sleep(0.05)
        busy = await client.post(URL, json={"message": "two"})
        assert busy.status_code == 409 and busy.json()["code"] == 40902
        assert "busy" in busy.json()["msg"]
        assert (await first).status_code == 200
    assert len(await engine.store.turns(SessionKey("local", SID))) == 2


def test_settings_read_the_new_limits() -> None:
    settings = ServiceSettings.from_env({"CONTEXTMODE_SESSION_WAIT_MS": "250", "CONTEXTMODE_STREAM_FLUSH_MS": "0"})
    assert settings.session_wait_ms == 250 and settings.stream_flush_ms == 0


