"""End to end over real HTTP: uvicorn on a loopback port, httpx and the official openai client,
the OpenAI-protocol stub server as the upstream model."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import uvicorn

from contextmode.models.openai import OpenAIChatModel
from contextmode.service import create_app
from contextmode.testing.stub_server import StubRequest, StubServer
from tests.service.test_service import SlowModel, make_engine, make_settings, sse_events


@contextmanager
def serving(app: Any, http: str = "h11") -> Iterator[str]:
    """Run ``app`` under uvicorn (``http``: h11 or httptools) in a background thread; yield its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="warning", lifespan="on", loop="asyncio", http=http)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


async def wait_for(predicate: Any, timeout: float = 10.0) -> Any:
    """Poll ``predicate`` (async) until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.05)


PNG_URL = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40).decode()


async def test_streaming_a_turn_end_to_end_over_http(tmp_path: Path) -> None:
    # No coalescing here: this test checks that each delta is its own event.
    settings = dataclasses.replace(make_settings(tmp_path), stream_flush_ms=0)
    app = create_app(make_engine(SlowModel(["春眠", "不觉", "晓"], delay_s=0.01)), settings)
    with serving(app) as base:
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            arrivals: list[str] = []
            async with client.stream("POST", "/v1/sessions/poem/messages", json={"message": "背一句诗", "stream": True}) as r:
                assert r.status_code == 200
                assert r.headers["content-type"].startswith("text/event-stream")
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        arrivals.append(line)
            events = sse_events("\n\n".join(arrivals))
            assert [e if isinstance(e, str) else e["type"] for e in events] == [
                "context", "delta", "delta", "delta", "done", "[DONE]",
            ]
            assert events[-2]["answer"] == "春眠不觉晓"
            history = (await client.get("/v1/sessions/poem")).json()["data"]
            assert [(t["role"], t["content"], t["partial"]) for t in history["turns"]] == [
                ("user", "背一句诗", False),
                ("assistant", "春眠不觉晓", False),
            ]


@pytest.mark.parametrize("http", ["h11", "httptools"])
async def test_client_dropping_mid_stream_stores_both_turns_with_a_partial_answer(tmp_path: Path, http: str) -> None:
    settings = make_settings(tmp_path)
    model = SlowModel(["第一段。", "第二段。", "第三段。", "第四段。"], delay_s=0.3)
    app = create_app(make_engine(model), settings)
    with serving(app, http) as base:
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            body = {"message": "讲个长故事", "stream": True, "images": [PNG_URL]}
            async with client.stream("POST", "/v1/sessions/drop/messages", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: ") and '"type":"delta"' in line:
                        assert os.listdir(settings.image_dir)  # the image exists while the turn runs
                        break  # leave after the first delta: the connection is closed

        async with httpx.AsyncClient(base_url=base, timeout=10) as client:

            async def two_turns() -> list[dict[str, Any]] | None:
                data = (await client.get("/v1/sessions/drop")).json()["data"]
                return data["turns"] if data and len(data["turns"]) == 2 else None

            turns = await wait_for(two_turns)
            assert turns is not None, "the answer was not stored after the client left"
            assert turns[0]["content"] == "讲个长故事" and turns[0]["metadata"]["image_count"] == 1
            assert turns[1]["partial"] is True
            assert turns[1]["content"].startswith("第一段。") and turns[1]["content"] != "第一段。第二段。第三段。第四段。"

            async def stream_closed() -> bool:
                text = (await client.get("/metrics")).text
                return "contextmode_active_streams 0.0" in text and 'outcome="client_gone"} 1.0' in text

            assert await wait_for(stream_closed)
    assert os.listdir(settings.image_dir) == []


async def test_openai_client_through_the_proxy_with_the_stub_server_upstream(tmp_path: Path) -> None:
    def reply(request: StubRequest) -> str:
        seen = " | ".join(str(m.get("content")) for m in request.messages)
        return "名字是小明" if "我叫小明" in seen and "我叫什么" in request.last_user else "好的"

    stub = StubServer(reply, chunk_chars=2)
    with stub as upstream_url:
        upstream = OpenAIChatModel(model="stub-model", base_url=upstream_url, api_key="upstream-secret", max_retries=0)
        settings = make_settings(tmp_path, api_keys={"app-key": "appTenant"})
        with serving(create_app(make_engine(upstream), settings)) as base:
            client = openai.AsyncOpenAI(
                base_url=f"{base}/v1", api_key="app-key", max_retries=0, default_headers={"X-Session-Id": "chat-1"}
            )
            first = await client.chat.completions.create(
                model="whatever",
                messages=[{"role": "system", "content": "你是一个简洁的助手"}, {"role": "user", "content": "我叫小明"}],
            )
            assert first.object == "chat.completion"
            assert first.choices[0].message.content == "好的"
            assert first.usage is not None and first.usage.prompt_tokens > 0
            assert "你是一个简洁的助手" in stub.chat_requests[-1].messages[0]["content"]

            stream = await client.chat.completions.create(
                model="whatever", messages=[{"role": "user", "content": "我叫什么?"}], stream=True
            )
            pieces = [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
            assert "".join(pieces) == "名字是小明"
            # the app sent only its new message; context-mode supplied the history upstream
            upstream_text = " | ".join(str(m["content"]) for m in stub.chat_requests[-1].messages)
            assert "我叫小明" in upstream_text
            async with httpx.AsyncClient(base_url=base, headers={"Authorization": "Bearer app-key"}) as http:
                turns = (await http.get("/v1/sessions/chat-1")).json()["data"]["turns"]
            assert [t["content"] for t in turns] == ["我叫小明", "好的", "我叫什么?", "名字是小明"]

            with pytest.raises(openai.AuthenticationError):
                await openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="wrong", max_retries=0).chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}], user="chat-2"
                )
            stub.fail_next(503, count=3)
            with pytest.raises(openai.APIStatusError) as info:
                await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "在吗"}])
            assert info.value.status_code == 502
            assert isinstance(info.value.body, dict) and info.value.body["code"] == "model_unavailable"
            await client.close()


async def test_client_dropping_the_proxy_stream_keeps_the_partial_answer(tmp_path: Path) -> None:
    model = SlowModel(["one ", "two ", "three ", "four"], delay_s=0.3)
    app = create_app(make_engine(model), make_settings(tmp_path))
    with serving(app) as base:
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            body = {"model": "m", "messages": [{"role": "user", "content": "count"}], "stream": True, "user": "p1"}
            async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if '"content":"one "' in line:
                        break

            async def two_turns() -> list[dict[str, Any]] | None:
                data = (await client.get("/v1/sessions/p1")).json()["data"]
                return data["turns"] if data and len(data["turns"]) == 2 else None

            turns = await wait_for(two_turns)
    assert turns is not None
    assert turns[1]["partial"] is True and turns[1]["content"].startswith("one ")
