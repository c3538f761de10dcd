"""Follow-ups over HTTP on the embedded defaults (offline processors, no model): each of the
issue's messages gets an answer (code 0) and a turn number, streamed or not."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from contextmode.types import SessionKey

pytest.importorskip("fastapi")

from contextmode.api import build_engine
from contextmode.engine import Engine
from contextmode.models.offline import OfflineResponder
from contextmode.service import ServiceSettings, create_app
from contextmode.settings import EngineSettings
from contextmode.types import NewTurn

from .test_service import assert_error, client_for, sse_events

FOLLOW_UPS = [
    ("这周的计划：周一健身，周三读书，预算50元以内", ["详细一点", "举个例子", "帮我总结一下这周的计划"]),
    ("My plan this week: gym on Monday, reading on Wednesday", ["Tell me more", "Give me an example", "Summarize my plan"]),
]


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    # The README's embedded defaults: offline processors, the offline responder, BM25 recall.
    engine = build_engine(store="memory://", model=OfflineResponder(), settings=EngineSettings())
    yield engine
    await engine.close()


@pytest.fixture
async def client(engine: Engine, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(create_app(engine, ServiceSettings(image_dir=tmp_path / "images"))) as c:
        yield c


async def _send(client: httpx.AsyncClient, session: str, message: str, stream: bool) -> dict[str, Any]:
    r = await client.post(f"/v1/sessions/{session}/messages", json={"message": message, "stream": stream})
    assert r.status_code == 200, r.text
    if not stream:
        body = r.json()
        assert body["code"] == 0, body
        return dict(body["data"])
    events = sse_events(r.text)
    assert [e["type"] for e in events if isinstance(e, dict)][-1] == "done", events
    return dict(events[-2])


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("first", "follow_ups"), FOLLOW_UPS)
async def test_each_follow_up_is_answered_and_numbered(
    client: httpx.AsyncClient, first: str, follow_ups: list[str], stream: bool
) -> None:
    await _send(client, "s", first, stream)
    for number, message in enumerate(follow_ups, 2):
        done = await _send(client, "s", message, stream)
        assert done["turn"] == number
        assert first in done["answer"]  # the offline answer shows the exchange it builds on
    session = (await client.get("/v1/sessions/s")).json()["data"]
    users = [(t["content"], t["metadata"]["turn"]) for t in session["turns"] if t["role"] == "user"]
    assert users == [(first, 1)] + [(m, n) for n, m in enumerate(follow_ups, 2)]


async def test_the_refusal_stays_when_nothing_was_answered(client: httpx.AsyncClient, engine: Engine) -> None:
    # A user turn with no answer at all (the model failed before any text).
    await engine.store.append(SessionKey("local", "s"), [NewTurn(role="user", content="什么是熵", tokens=4)])
    r = await client.post("/v1/sessions/s/messages", json={"message": "举个例子"})
    assert "当前没有可用的上文信息" in assert_error(r, 42201)["msg"]
