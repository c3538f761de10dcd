"""A client that keeps its socket open but stops reading does not hold its session.

The ASGI ``send`` of the stream's first text never completes (the client's receive window
is full) and no disconnect ever arrives. After ``sse_send_timeout_s`` the service stops
sending, finishes the turn without the client (the whole answer is stored, not a partial
one) and releases the session: the next turn of that session runs (it got 409 for as
long as the socket lived before).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from contextmode.service import create_app
from contextmode.service.settings import ServiceSettings
from contextmode.testing.models import FunctionModel
from contextmode.types import SessionKey
from tests.service.test_service import client_for, make_engine, make_settings


def _scope(path: str, body: bytes) -> dict[str, object]:
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(b"host", b"test"), (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 50000), "server": ("test", 80),
    }


async def test_a_client_that_stops_reading_frees_its_session_and_the_answer_is_kept(tmp_path: Path) -> None:
    engine = make_engine(FunctionModel(lambda messages: ["第一段，", "第二段，", "第三段。"]))
    app = create_app(engine, make_settings(tmp_path, sse_send_timeout_s=0.3, session_wait_ms=100))
    body = json.dumps({"message": "讲个故事", "stream": True}).encode()
    delivered = False
    never = asyncio.Event()

    async def receive() -> dict[str, object]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await never.wait()  # the socket stays open: no disconnect
        return {"type": "http.disconnect"}

    sent: list[bytes] = []

    async def send(message: dict[str, object]) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            sent.append(message["body"])  # type: ignore[arg-type]
            await never.wait()  # the client stopped reading: this write never completes

    try:
        await asyncio.wait_for(app(_scope("/v1/sessions/s1/messages", body), receive, send), 20)
        assert len(sent) == 1  # nothing more was written to the stalled client
        async with client_for(app) as client:
            r = await client.post("/v1/sessions/s1/messages", json={"message": "还在吗"})
            assert r.status_code == 200, r.text
        turns = await engine.store.turns(SessionKey("local", "s1"))
        assert turns[1].content == "第一段，第二段，第三段。" and not turns[1].metadata.get("partial")
    finally:
        never.set()
        await engine.close()


def test_the_send_timeout_is_configurable() -> None:
    assert ServiceSettings.from_env({"CONTEXTMODE_SSE_SEND_TIMEOUT_S": "2.5"}).sse_send_timeout_s == 2.5
    assert ServiceSettings.from_env({}).sse_send_timeout_s == 10.0


async def _cut_after_first_event(
    app: object, path: str, payload: dict[str, object], headers: dict[str, str]
) -> None:
    """Send ``payload`` as a stream with ``headers`` and leave once its first event arrived."""
    body = json.dumps(payload).encode()
    scope = _scope(path, body)
    scope["headers"] = [*scope["headers"], *((k.lower().encode(), v.encode()) for k, v in headers.items())]  # type: ignore[misc]
    first = asyncio.Event()
    delivered = False

    async def receive() -> dict[str, object]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await first.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, object]) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            first.set()
            await asyncio.sleep(3600)  # the client is gone before this arrives

    await asyncio.wait_for(app(scope, receive, send), 20)  # type: ignore[operator]


async def test_the_replay_of_a_cut_off_stream_ends_with_an_explicit_error(tmp_path: Path) -> None:
    async def slow(messages: object) -> list[str]:
        await asyncio.sleep(0.2)
        return ["一", "二"]

    engine = make_engine(FunctionModel(slow))
    app = create_app(engine, make_settings(tmp_path, stream_flush_ms=0))
    cases: list[tuple[str, dict[str, object], dict[str, str]]] = [
        ("/v1/sessions/s1/messages", {"message": "你好", "stream": True}, {}),
        ("/v1/chat/completions", {"model": "m", "stream": True, "messages": [{"role": "user", "content": "你好"}]},
         {"X-Session-Id": "s2"}),
    ]
    try:
        async with client_for(app) as client:
            for i, (path, payload, headers) in enumerate(cases):
                keyed = {**headers, "Idempotency-Key": f"cut-{i}"}
                await _cut_after_first_event(app, path, payload, keyed)
                again = await client.post(path, json=payload, headers=keyed)
                assert again.status_code == 200 and again.headers["idempotent-replayed"] == "true"
                events = [line[6:] for line in again.text.splitlines() if line.startswith("data: ")]
                assert events[-1] == "[DONE]", events
                last = json.loads(events[-2])
                code = last["code"] if isinstance(last.get("code"), int) else last["error"]["contextmode_code"]
                assert code == 40905, last
    finally:
        await engine.close()
