"""Prompt caching on the wire, with the stub server as the model (it reports as cached the part
of each prompt that repeats the previous request's, as a server's prompt cache would):
OpenAI's ``prompt_cache_key`` per session, llama.cpp's ``cache_prompt``, Anthropic's
``cache_control`` breakpoints on the stable part and ``cache_read_input_tokens`` in the
``/v1/messages`` proxy's usage, and each exchange's usage and money in its trace."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest

from contextmode.assembly import to_anthropic
from contextmode.engine import Engine, TurnRequest
from contextmode.models.caching import request_text, session_cache_key
from contextmode.models.openai import OpenAIChatModel, OpenAIOptions
from contextmode.models.server import ServerInfo
from contextmode.service import create_app
from contextmode.testing.stub_server import StubRequest, StubServer
from contextmode.types import ChatMessage, SessionKey
from tests.service.test_service import make_engine, make_settings

SAID = ["I keep bees on my roof in Lyon.", "What should I plant for them?", "And in the shade?",
        "How often do I check the hives?"]


def reply(request: StubRequest) -> str:
    return f"About {request.last_user[:30]}: a short answer."


def _model(stub: StubServer, *, kind: str = "openai", name: str = "gpt-5-mini") -> OpenAIChatModel:
    return OpenAIChatModel(model=name, base_url=stub.url, api_key="k", options=OpenAIOptions(
        prompt_cache_key=True, server_info=ServerInfo(kind=kind), slots=0))  # type: ignore[arg-type]


async def _talk(engine: Engine, session: str, said: list[str]) -> None:
    for text in said:
        await engine.turn(TurnRequest(key=SessionKey("t", session), message=text))
    await engine.drain()


async def test_openai_requests_carry_one_cache_key_per_session(stub: StubServer) -> None:
    engine = make_engine(_model(stub), context_window=4000)
    try:
        await _talk(engine, "bees-1", SAID[:2])
        await _talk(engine, "bees-2", SAID[:1])
        keys = [r.body.get("prompt_cache_key") for r in stub.chat_requests if "Lyon" in str(r.messages)
                or "plant" in str(r.messages)]
        assert keys[:2] == [session_cache_key("t", "bees-1")] * 2
        assert keys[2] == session_cache_key("t", "bees-2") != keys[0]
        assert all("bees" not in str(k) and "cache_prompt" not in r.body for k, r in zip(keys, stub.chat_requests,
                                                                                        strict=False))
        # A call made outside a session's turn (no cache_session) carries no hint.
        await engine.model.complete([ChatMessage(role="user", content="hello")])
        assert "prompt_cache_key" not in stub.chat_requests[-1].body
    finally:
        await engine.close()
        await engine.model.aclose()  # type: ignore[attr-defined]


async def test_a_llamacpp_server_gets_cache_prompt(stub: StubServer) -> None:
    engine = make_engine(_model(stub, kind="llamacpp", name="smollm2"), context_window=4000)
    try:
        await _talk(engine, "bees", SAID[:1])
        body = stub.chat_requests[-1].body
        assert body["cache_prompt"] is True and "prompt_cache_key" not in body
    finally:
        await engine.close()
        await engine.model.aclose()  # type: ignore[attr-defined]


async def test_each_trace_holds_the_cacheable_and_cached_tokens_and_the_money(stub: StubServer) -> None:
    # The ``cache_first`` order: recall and the hint after the turns, so the prefix repeats.
    engine = make_engine(_model(stub), context_window=4000, order="cache_first")
    try:
        await _talk(engine, "bees", SAID)
        traces = [await engine.trace(SessionKey("t", "bees"), n) for n in range(1, len(SAID) + 1)]
    finally:
        await engine.close()
        await engine.model.aclose()  # type: ignore[attr-defined]
    first, *rest = [t.usage for t in traces]
    assert first is not None and first.cacheable_tokens == 0 and first.price_family == "openai"
    for usage, trace, before in zip(rest, traces[1:], traces[:-1], strict=True):
        assert usage is not None and usage.cacheable_tokens is not None
        # The request repeats the previous one up to the turns: instructions and the earlier turns.
        shared = request_text(before.messages)
        assert 0 < usage.cacheable_tokens < usage.prompt_tokens
        assert request_text(trace.messages).startswith(shared.split("<|im_start|>user")[0])
        # The stub reports what it served from its cache; the money counts it at the cache price.
        assert usage.cached_tokens is not None and usage.cached_tokens > 0
        assert usage.usd is not None and usage.session_usd is not None
        assert usage.session_usd == pytest.approx(usage.usd + (before.usage.session_usd or 0.0))  # type: ignore[union-attr]


def test_the_anthropic_renderer_marks_the_end_of_the_stable_part() -> None:
    from contextmode.assembly import AssemblyConfig, CurrentTurn, assemble
    from tests.assembly.test_assembly import COUNTER, NOW, _full_state

    ctx = assemble(_full_state(), "推荐个菜", counter=COUNTER, strategy="hybrid", now=NOW,
                   current=CurrentTurn(hint="推荐个川菜"), config=AssemblyConfig(order="cache_first"))
    request = to_anthropic(ctx, cache=True)
    assert request["system"][0]["cache_control"] == {"type": "ephemeral"}
    blocks = [(m["role"], b) for m in request["messages"] for b in m["content"]]
    marked = [i for i, (_, b) in enumerate(blocks) if "cache_control" in b]
    # One breakpoint in the messages, on the newest turn; the key moments, the hint and the
    # message (what changes every turn) come after it.
    assert len(marked) == 1
    after = "".join(b["text"] for _, b in blocks[marked[0] + 1:])
    assert "关键情绪时刻" in after and "推荐个川菜" in after and after.endswith("推荐个菜")
    assert blocks[marked[0]][1]["text"] == _full_state().turns[-1].content
    plain = to_anthropic(ctx)
    assert isinstance(plain["system"], str) and all(isinstance(m["content"], str) for m in plain["messages"])


@pytest.fixture
async def sdk(stub: StubServer, tmp_path: Path) -> AsyncIterator[anthropic.AsyncAnthropic]:
    engine = make_engine(_model(stub, name="claude-sonnet"), context_window=4000)
    app: Any = create_app(engine, make_settings(tmp_path))
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://test") as http:
        yield anthropic.AsyncAnthropic(base_url="http://test", api_key="unused", http_client=http)
    await engine.close()
    await engine.model.aclose()  # type: ignore[attr-defined]


async def test_the_messages_proxy_reports_what_the_cache_served(sdk: anthropic.AsyncAnthropic) -> None:
    first = await sdk.messages.create(model="m", max_tokens=50, messages=[{"role": "user", "content": SAID[0]}],
                                      metadata={"user_id": "beekeeper"})
    second = await sdk.messages.create(model="m", max_tokens=50, messages=[{"role": "user", "content": SAID[1]}],
                                       metadata={"user_id": "beekeeper"})
    assert not first.usage.cache_read_input_tokens
    cached = second.usage.cache_read_input_tokens
    assert cached is not None and cached > 0
    async with sdk.messages.stream(model="m", max_tokens=50, messages=[{"role": "user", "content": SAID[2]}],
                                   metadata={"user_id": "beekeeper"}) as stream:
        final = await stream.get_final_message()
    assert final.usage.cache_read_input_tokens
