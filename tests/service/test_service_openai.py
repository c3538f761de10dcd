"""The OpenAI-compatible memory proxy in process: the official openai client over httpx ASGITransport."""

from __future__ import annotations

import base64
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from contextmode.errors import ModelError
from contextmode.service import create_app
from contextmode.testing.models import BrokenStream, FunctionModel, ScriptedModel
from contextmode.types import SessionKey
from tests.service.test_service import SlowModel, client_for, make_engine, make_settings

PNG_URL = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40).decode()


@pytest.fixture
def model() -> FunctionModel:
    return FunctionModel(lambda messages: ["答：", messages[-1].content[:8]])


@pytest.fixture
def app(model: FunctionModel, tmp_path: Path) -> Any:
    return create_app(make_engine(model), make_settings(tmp_path))


@pytest.fixture
async def sdk(app: Any) -> AsyncIterator[Any]:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")
    client = openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", http_client=http, max_retries=0)
    yield client
    await client.close()


async def test_completion_keeps_memory_between_calls(sdk: Any, model: FunctionModel) -> None:
    first = await sdk.chat.completions.create(
        model="gpt-x", messages=[{"role": "user", "content": "我不吃辣"}], user="u1"
    )
    assert first.model == "gpt-x"
    assert first.choices[0].message.content == "答：我不吃辣"
    assert first.choices[0].finish_reason == "stop"
    assert first.usage.total_tokens == first.usage.prompt_tokens + first.usage.completion_tokens
    # an app that resends the whole history is fine: only the last user message is new
    await sdk.chat.completions.create(
        model="gpt-x",
        messages=[
            {"role": "user", "content": "我不吃辣"},
            {"role": "assistant", "content": "答：我不吃辣"},
            {"role": "user", "content": "推荐一家店"},
        ],
        user="u1",
    )
    sent = [m.content for m in model.calls[-1].messages]
    assert sum("我不吃辣" in c for c in sent) >= 1  # from context-mode's memory, once
    assert sent[-1].endswith("推荐一家店")


async def test_streaming_chunks_end_with_stop_and_usage(sdk: Any) -> None:
    stream = await sdk.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "你好"}],
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"X-Session-Id": "s-stream"},
    )
    chunks = [chunk async for chunk in stream]
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "答：你好"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


async def test_system_message_becomes_the_turns_system_prompt(sdk: Any, model: FunctionModel) -> None:
    await sdk.chat.completions.create(
        model="m",
        messages=[{"role": "system", "content": "只用英文回答"}, {"role": "user", "content": "hi"}],
        user="sys",
    )
    assert "只用英文回答" in model.calls[-1].system
    await sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "again"}], user="sys")
    assert "只用英文回答" not in model.calls[-1].system  # per turn, the engine's own prompt is untouched


async def test_image_parts_go_through_the_boundary(app: Any, sdk: Any, tmp_path: Path) -> None:
    await sdk.chat.completions.create(
        model="m",
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "看图"}, {"type": "image_url", "image_url": {"url": PNG_URL}}],
            }
        ],
        user="img",
    )
    turn = (await app.state.contextmode.engine.store.turns(SessionKey("local", "img")))[0]
    assert (turn.content, turn.metadata["image_count"]) == ("看图", 1)
    assert os.listdir(tmp_path / "images") == []
    with pytest.raises(openai.BadRequestError) as info:
        await sdk.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}, {"type": "text", "text": "?"}]}],
            user="img",
        )
    assert info.value.body["code"] == "bad_image"


async def test_errors_have_openais_shape(sdk: Any) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "no session"}])
    assert info.value.status_code == 400
    assert info.value.body["type"] == "invalid_request_error" and "X-Session-Id" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError):
        await sdk.chat.completions.create(model="m", messages=[{"role": "assistant", "content": "x"}], user="s")
    with pytest.raises(openai.BadRequestError) as info:
        await sdk.chat.completions.create(model="m", messages=[], user="s")
    assert info.value.body["contextmode_code"] == 40001
    with pytest.raises(openai.BadRequestError) as info:  # any string is mapped, up to 76 bytes
        await sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], user="名" * 30)
    assert info.value.body["code"] == "invalid_session_id"


async def test_model_errors_before_and_during_the_stream(tmp_path: Path) -> None:
    engine = make_engine(ScriptedModel([ModelError("boom"), BrokenStream(chunks=["半句"])]))
    app = create_app(engine, make_settings(tmp_path))
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")
    sdk = openai.AsyncOpenAI(base_url="http://test/v1", api_key="k", http_client=http, max_retries=0)
    with pytest.raises(openai.APIStatusError) as info:
        await sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}], user="e")
    assert info.value.status_code == 502 and info.value.body["type"] == "server_error"
    stream = await sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "b"}], user="e", stream=True)
    got: list[str] = []
    with pytest.raises(openai.APIError, match="stream broke"):
        async for chunk in stream:
            got.append(chunk.choices[0].delta.content or "")
    assert "".join(got) == "半句"
    turns = await engine.store.turns(SessionKey("local", "e"))
    assert [(t.content, t.partial) for t in turns] == [("a", False), ("b", False), ("半句", True)]
    await sdk.close()


async def test_proxy_auth_and_models_listing(tmp_path: Path) -> None:
    app = create_app(make_engine(SlowModel(["ok"])), make_settings(tmp_path, api_keys={"k1": "t1"}))
    async with client_for(app) as c:
        r = await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "user": "s"})
        assert r.status_code == 401
        assert r.json()["error"]["type"] == "authentication_error"
        models = (await c.get("/v1/models", headers={"Authorization": "Bearer k1"})).json()
        assert models["data"][0]["id"] == "slow-model"
        r = await c.post(
            "/v1/chat/completions", content=b"{oops", headers={"Authorization": "Bearer k1", "content-type": "application/json"}
        )
        assert r.status_code == 400 and r.json()["error"]["code"] == "validation_error"
