"""The MCP server with the official mcp SDK's own client: in process, over stdio
(``python -m contextmode mcp`` as a subprocess) and over streamable HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters

from contextmode.api import ContextMode
from contextmode.integrations.mcp_server import build_server
from contextmode.settings import EngineSettings
from contextmode.testing.models import FunctionModel

TOOLS = {"remember", "get_context", "search_memory", "list_pins", "remove_pin", "get_trace"}
FILLER = ["What's a good name for a cat?", "Maybe Mochi.", "How long do cats sleep?", "Around 15 hours a day."]


@pytest.fixture
async def memory() -> AsyncIterator[ContextMode]:
    cm = ContextMode(store="memory://", model=FunctionModel(lambda messages: ["好的"]),
                     settings=EngineSettings(context_window=1200, reply_reserve=200))
    yield cm
    await cm.aclose()


async def call(client: Client, tool: str, **arguments: Any) -> Any:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    content = result.structured_content
    return content["result"] if set(content) == {"result"} else content


async def error_of(client: Client, tool: str, **arguments: Any) -> str:
    result = await client.call_tool(tool, arguments)
    assert result.is_error
    return " ".join(getattr(part, "text", "") for part in result.content)


async def test_memory_tools_in_process(memory: ContextMode) -> None:
    async with Client(build_server(memory)) as client:
        listed = (await client.list_tools()).tools
        assert {t.name for t in listed} == TOOLS
        assert all(t.description and t.output_schema for t in listed)

        stored = await call(client, "remember", session_id="trip", role="user", content="我不吃辣，预算五十以内")
        assert (stored["seq"], stored["turn"], stored["role"]) == (1, 1, "user")
        await call(client, "remember", session_id="trip", role="assistant", content="好的，记住了")
        await call(client, "remember", session_id="trip", role="user",
                   content="I'm flying to Lisbon on May 3rd, remind me to pack sunscreen")
        for n in range(30):  # a long conversation: the early turns leave the recent window
            await call(client, "remember", session_id="trip", role="user" if n % 2 == 0 else "assistant",
                       content=FILLER[n % len(FILLER)])

        pins = await call(client, "list_pins", session_id="trip")
        assert {p["key"]: p["value"] for p in pins}["spice"] == "不吃辣"

        hits = await call(client, "search_memory", session_id="trip", query="when is the Lisbon flight", limit=3)
        assert hits[0]["seq"] == 3 and "Lisbon" in hits[0]["content"] and hits[0]["score"] > 0
        assert len(hits) <= 3

        context = await call(client, "get_context", session_id="trip", message="推荐一家餐厅")
        layers = {layer["name"]: layer for layer in context["layers"]}
        assert "不吃辣" in layers["constraints"]["rendered"]
        # The whole conversation fits the window: every turn is sent (the summary steps aside).
        assert layers["recent"]["dropped_seqs"] == []
        assert context["total_tokens"] <= context["input_budget"]
        system = context["messages"][0]["content"]
        assert "不吃辣" in system and context["messages"][-1]["content"].endswith("推荐一家餐厅")

        removed = await call(client, "remove_pin", session_id="trip", key="spice")
        assert removed["removed"] is True and "spice" not in {p["key"] for p in removed["pins"]}
        assert "spice" not in {p["key"] for p in await call(client, "list_pins", session_id="trip")}
        again = await call(client, "remove_pin", session_id="trip", key="spice")
        assert again["removed"] is False
        context = await call(client, "get_context", session_id="trip", message="推荐一家餐厅")
        pinned = {layer["name"]: layer for layer in context["layers"]}["constraints"]["rendered"]
        assert "预算" in pinned and "不吃辣" not in pinned  # unpinned; the turn itself stays in the history

        # A live turn keeps its trace; the tool reads it by exchange number.
        result = await memory.achat("trip", "那就订葡萄牙菜吧")
        number = result.user_turn.metadata["turn"]
        trace = await call(client, "get_trace", session_id="trip", turn=number)
        assert trace["turn"] == number and trace["messages"][-1]["content"].endswith("那就订葡萄牙菜吧")

        assert "no kept context" in await error_of(client, "get_trace", session_id="trip", turn=1)
        assert "invalid session id" in await error_of(client, "list_pins", session_id="bad id!")
        assert "no session" in await error_of(client, "get_trace", session_id="nobody", turn=1)


def _env(tmp_path: Path) -> dict[str, str]:
    src = str(Path(__file__).resolve().parents[2] / "src")
    return {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "CONTEXTMODE_HOME": str(tmp_path / "home")}


async def test_stdio_server_subprocess(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'memory.db'}"
    params = StdioServerParameters(command=sys.executable, args=["-m", "contextmode", "mcp", "--store", store],
                                   env=_env(tmp_path))
    async with Client(params) as client:
        assert {t.name for t in (await client.list_tools()).tools} == TOOLS
        for role, content in [("user", "The weather is nice today."), ("user", "My locker code is 4417."),
                              ("assistant", "Noted.")]:
            await call(client, "remember", session_id="s", role=role, content=content)
        hits = await call(client, "search_memory", session_id="s", query="locker code")
        assert hits[0]["content"] == "My locker code is 4417."
        assert all(h["score"] < hits[0]["score"] for h in hits[1:])
    # The process closed its store on exit: the turns are on disk for the next server.
    reopened = ContextMode(store=store)
    try:
        assert [t.content for t in await reopened.aturns("s")][1] == "My locker code is 4417."
    finally:
        await reopened.aclose()


@contextlib.asynccontextmanager
async def http_server(tmp_path: Path, **env: str) -> AsyncIterator[str]:
    """``contextmode mcp --http`` in a subprocess (extra ``env``); yields its URL, and checks it
    shuts down cleanly."""
    with socket.socket() as probe:  # a free port for the server
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = f"sqlite:///{tmp_path / 'memory.db'}"
    server = subprocess.Popen(
        [sys.executable, "-m", "contextmode", "mcp", "--http", "--port", str(port), "--store", store],
        env={**_env(tmp_path), **env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            with socket.socket() as s, contextlib.suppress(OSError):
                s.connect(("127.0.0.1", port))
                break
            assert server.poll() is None and time.monotonic() < deadline, server.stderr.read() if server.stderr else ""
            await asyncio.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.terminate()
        assert server.wait(timeout=30) == 0  # a clean shutdown closes the store


async def test_streamable_http_server_subprocess(tmp_path: Path) -> None:
    async with http_server(tmp_path) as url, Client(url) as client:
        assert {t.name for t in (await client.list_tools()).tools} == TOOLS
        await call(client, "remember", session_id="h", role="user", content="我叫小明，我对花生过敏")
        context = await call(client, "get_context", session_id="h", message="我叫什么?")
        assert "小明" in " ".join(m["content"] for m in context["messages"])


INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}}
MCP_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


async def test_http_transport_requires_the_services_api_key(tmp_path: Path) -> None:
    import httpx

    keys = {"CONTEXTMODE_API_KEYS": "key-local:local,key-other:other"}
    async with http_server(tmp_path, **keys) as url, httpx.AsyncClient(timeout=30) as http:
        refused = {}
        for name, extra in (("none", {}), ("unknown", {"authorization": "Bearer nope"}),
                            ("other tenant", {"x-api-key": "key-other"})):
            reply = await http.post(url, json=INITIALIZE, headers={**MCP_HEADERS, **extra})
            is_json = reply.headers.get("content-type", "").startswith("application/json")
            refused[name] = (reply.status_code, reply.json().get("code") if is_json else reply.text[:40])
        assert refused == {"none": (401, 40101), "unknown": (401, 40101), "other tenant": (401, 40101)}
        for extra in ({"authorization": "Bearer key-local"}, {"x-api-key": "key-local"}):
            accepted = await http.post(url, json=INITIALIZE, headers={**MCP_HEADERS, **extra})
            assert accepted.status_code == 200 and "serverInfo" in accepted.text


async def test_stdio_transport_takes_no_api_key(tmp_path: Path) -> None:
    env = {**_env(tmp_path), "CONTEXTMODE_API_KEYS": "key-local:local"}
    params = StdioServerParameters(command=sys.executable, args=["-m", "contextmode", "mcp"], env=env)
    async with Client(params) as client:
        assert {t.name for t in (await client.list_tools()).tools} == TOOLS
