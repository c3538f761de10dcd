"""A turn whose client has gone ends and lets its session go: the client's next message is
answered, never refused as busy because the abandoned turn is still generating.

The app is called as an ASGI application with the client's side played by hand: the body, then
an ``http.disconnect`` while the model is still answering (a model that never finishes: only
ending the turn frees the session)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from contextmode.service import create_app
from contextmode.types import ChatMessage, SessionKey
from tests.service.test_service import client_for, make_engine, make_settings

from ..models.test_priority import until


def scope_for(path: str) -> dict[str, Any]:
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(b"host", b"test"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 5000), "server": ("test", 80),
    }


async def test_a_whole_answer_whose_client_left_ends_and_the_next_message_is_answered(tmp_path: Path) -> None:
    started, never = asyncio.Event(), asyncio.Event()

    class Endless:
        """Streams part of an answer to the first message, then never finishes."""

        name = "endless"

        async def stream(self, messages: Sequence[ChatMessage], *, max_tokens: int | None = None) -> AsyncIterator[str]:
            if messages[-1].content.startswith("first"):
                yield "Part of an answer"
                started.set()
                await never.wait()  # generating for nobody, for ever
            yield "second answer"

        async def complete(self, messages: Sequence[ChatMessage], *, max_tokens: int | None = None) -> str:
            return "".join([d async for d in self.stream(messages)])

    engine = make_engine(Endless())
    app = create_app(engine, make_settings(tmp_path, session_wait_ms=200))
    left = asyncio.Event()
    body = json.dumps({"message": "first message"}).encode()
    sent: list[dict[str, Any]] = []
    calls = 0

    async def receive() -> dict[str, Any]:
        nonlocal calls
        calls += 1
        if calls == 1:
            return {"type": "http.request", "body": body, "more_body": False}
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    first = asyncio.create_task(app(scope_for("/v1/sessions/s1/messages"), receive, send))
    await started.wait()
    left.set()  # the client gives up (its own timeout)
    await asyncio.wait_for(first, 10)
    assert sent[0]["status"] == 499
    async with client_for(app) as client:
        response = await client.post("/v1/sessions/s1/messages", json={"message": "next message"})
    assert response.status_code == 200, response.text
    assert response.json()["data"]["answer"] == "second answer"
    await until(lambda: not engine.trace_writes.pending("local", "s1"))
    turns = await engine.store.turns(SessionKey("local", "s1"))
    assert [(t.role, t.content, bool(t.metadata.get("partial"))) for t in turns] == [
        ("user", "first message", False), ("assistant", "Part of an answer", True),
        ("user", "next message", False), ("assistant", "second answer", False),
    ]
    await engine.close()
