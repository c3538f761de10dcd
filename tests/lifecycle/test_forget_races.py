"""Forget racing a turn: an erasure while the answer streams brings nothing back.

A turn is held mid-answer (its model waits on an event) while the user, the
session or the retention policy erases the session; then the model answers.
Afterwards no planted string of the conversation, of the held message or of
the answer may be found in the store (SQLite: also the raw file and WAL bytes),
the session must not exist, and the stream must have ended with an error event
saying the session was erased (the non-streamed turn: 404 with that message).
"""

from __future__ import annotations

import asyncio
import json
import random
import string
from collections.abc import Sequence
from pathlib import Path

import httpx
import pytest

from contextmode.api import build_engine
from contextmode.engine import Engine
from contextmode.service.app import create_app
from contextmode.service.settings import ServiceSettings
from contextmode.store import open_store
from contextmode.testing.backends import Backend, fresh_store_url
from contextmode.testing.models import FunctionModel
from contextmode.types import ChatMessage, SessionKey
from tests.lifecycle.test_forget_verified import _hits, _store_text

_BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres),
             pytest.param("redis", marks=pytest.mark.redis)]


def _planted(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"zq{''.join(rng.choices(string.ascii_lowercase, k=10))}q" for _ in range(count)]


class _HeldModel:
    """Answers at once until `hold` is set; then each call waits for `release`."""

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.hold = False
        self.asked = asyncio.Event()
        self.release = asyncio.Event()
        self.model = FunctionModel(self._reply, name="held")

    async def _reply(self, messages: Sequence[ChatMessage]) -> list[str]:
        if self.hold:
            self.asked.set()
            await self.release.wait()
        return ["好的，", self.answer]


def _events(body: str) -> list[dict[str, object]]:
    return [json.loads(line[6:]) for line in body.splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]


async def _erase(client: httpx.AsyncClient, engine: Engine, how: str, session: str) -> None:
    if how == "user":
        r = await client.delete("/v1/users/alice")
        assert r.status_code == 200, r.text
        assert r.json()["data"]["counts"]["sessions"] == 1
    elif how == "session":
        r = await client.delete(f"/v1/sessions/{session}")
        assert r.status_code == 200, r.text
    else:  # retention erases through the same path as forget
        from contextmode.lifecycle.forget import forget

        await forget(engine.store, "local", "session", session, actor="retention", caches=[engine])


@pytest.mark.parametrize("how", ["user", "session", "retention"])
@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("backend", _BACKENDS)
async def test_forget_during_a_turn_brings_nothing_back(
    backend: Backend, stream: bool, how: str, tmp_path: Path
) -> None:
    earlier, held, answered = _planted(5, 1), _planted(5, 2), _planted(5, 3)
    model = _HeldModel(" ".join(answered))
    session = "alice-race"
    async with fresh_store_url(backend, tmp_path) as url:
        engine = build_engine(store=open_store(url), model=model.model)
        app = create_app(engine, ServiceSettings(image_dir=tmp_path / "images", forget_sync_s=0))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test",
                                     timeout=60) as client:
            try:
                r = await client.post(f"/v1/sessions/{session}/messages",
                                      json={"message": "记住 " + " ".join(earlier), "user_id": "alice"})
                assert r.status_code == 200, r.text
                await engine.drain()
                model.hold = True
                turn = asyncio.create_task(client.post(
                    f"/v1/sessions/{session}/messages",
                    json={"message": "还有 " + " ".join(held), "user_id": "alice", "stream": stream},
                ))
                await asyncio.wait_for(model.asked.wait(), 30)
                await _erase(client, engine, how, session)
                model.release.set()
                r = await turn
                if stream:
                    assert r.status_code == 200
                    last = _events(r.text)[-1]
                    assert last["type"] == "error" and last["code"] == 40401, last
                    assert "erased" in str(last["msg"])
                else:
                    assert r.status_code == 404, r.text
                    assert "erased" in r.json()["msg"]
                await engine.drain()
                assert await engine.store.info(SessionKey("local", session)) is None
                assert (await client.get("/v1/users")).json()["data"]["users"] == []
                text = await _store_text(backend, url)
                assert _hits(earlier + held + answered, text) == []
                # The session is usable again afterwards, from nothing.
                model.hold = False
                r = await client.post(f"/v1/sessions/{session}/messages", json={"message": "重新开始"})
                assert r.status_code == 200, r.text
                assert (await engine.store.info(SessionKey("local", session))).last_seq == 2
            finally:
                model.release.set()
                await engine.close()
