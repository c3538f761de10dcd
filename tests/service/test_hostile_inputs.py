"""Long and odd inputs in every text field: 2xx or a 4xx, never a 5xx, and what was
acknowledged is stored (on SQLite, PostgreSQL and Redis).

- A letters-and-digits run of 100,000 characters (a base64 blob, a hash list) in a message or a
  tool result is stored and found again by recall (PostgreSQL's index refused such a term: 503).
- NUL and lone surrogates anywhere in a request (tool results, system, model, tool names and
  call ids, user ids) are refused with 400 naming the field (they were 503 or 500).
- The library's `record` (and so MCP ``remember``) refuses them too.
"""

from __future__ import annotations

import json
import random
import string
from pathlib import Path
from typing import Any

import httpx
import pytest

from contextmode.api import ContextMode, build_engine
from contextmode.errors import InputError, StoreRefused
from contextmode.service.app import create_app
from contextmode.service.codes import code_for_exception, http_status, public_message
from contextmode.service.settings import ServiceSettings
from contextmode.settings import EngineSettings
from contextmode.store import open_store
from contextmode.testing.backends import Backend, fresh_store_url
from contextmode.types import NewTurn, SessionKey

_BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres),
             pytest.param("redis", marks=pytest.mark.redis)]

# One letters-and-digits run of 100,000 characters that does not compress (a base64 blob).
_RUN = "".join(random.Random(33).choices(string.ascii_letters + string.digits, k=100_000))


def _tool_body(result: str, *, call_id: str = "call_1", name: str = "lookup", model: str = "m",
               system: str = "be brief") -> dict[str, Any]:
    return {
        "model": model,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "look it up"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": call_id, "content": result},
        ],
        "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}],
    }


def _anthropic_body(result: str, *, system: str = "be brief", call_id: str = "toolu_1") -> dict[str, Any]:
    return {
        "model": "m", "max_tokens": 64, "system": system,
        "messages": [
            {"role": "user", "content": "look it up"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": call_id, "name": "lookup", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": result}]},
        ],
    }


def _raw(body: dict[str, Any]) -> bytes:
    # json.dumps escapes a lone surrogate as "\\udXXX", as a hostile client would send it.
    return json.dumps(body).encode()


@pytest.mark.parametrize("backend", _BACKENDS)
async def test_long_runs_are_stored_and_odd_characters_refused_never_a_5xx(
    backend: Backend, tmp_path: Path
) -> None:
    async with fresh_store_url(backend, tmp_path) as url:
        engine = build_engine(store=open_store(url), settings=EngineSettings(context_window=1_000_000))
        app = create_app(engine, ServiceSettings(image_dir=tmp_path / "images", max_message_chars=200_000))
        headers = {"content-type": "application/json"}
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test",
                                     timeout=120) as client:
            try:
                # Long runs: a message through the service, a tool result straight into the store.
                r = await client.post("/v1/sessions/long/messages", json={"message": f"blob {_RUN} end"})
                assert r.status_code == 200, r.text
                await engine.store.append(SessionKey("local", "long-tool"), [
                    NewTurn(role="user", content="look it up", tokens=3),
                    NewTurn(role="tool", content=f"result {_RUN}", tokens=9,
                            metadata={"tool_call_id": "call_1", "tool_name": "lookup"}),
                ])
                await engine.drain()
                turns = await engine.store.turns(SessionKey("local", "long"))
                assert _RUN in turns[0].content
                assert _RUN in (await engine.store.turns(SessionKey("local", "long-tool")))[1].content
                # The next turn (which analyses the run again, as a query) gets it in its context.
                r = await client.post("/v1/sessions/long/messages", json={"message": f"what was {_RUN}?"})
                assert r.status_code == 200, r.text
                recalled = r.json()["data"]["context"]
                assert _RUN in json.dumps(recalled, ensure_ascii=False)

                odd: list[tuple[str, bytes, str]] = [
                    ("/v1/chat/completions", _raw(_tool_body("a\x00b")), "messages[3].content"),
                    ("/v1/chat/completions", _raw(_tool_body("ok", call_id="c\ud800")), "tool_calls[0].id"),
                    ("/v1/chat/completions", _raw(_tool_body("ok", name="f\udfff")), "function.name"),
                    ("/v1/chat/completions", _raw(_tool_body("ok", model="m\ud800")), "model"),
                    ("/v1/chat/completions", _raw(_tool_body("ok", system="\udc00")), "messages[0].content"),
                    ("/v1/messages", _raw(_anthropic_body("a\x00b")), "content"),
                    ("/v1/messages", _raw(_anthropic_body("ok", system="s\ud800")), "system"),
                    ("/v1/messages", _raw(_anthropic_body("ok", call_id="t\ud800")), "id"),
                    ("/v1/sessions/odd/messages", _raw({"message": "hi", "user_id": "u\ud800"}), "user_id"),
                ]
                for path, body, field in odd:
                    r = await client.post(path, content=body, headers={**headers, "X-Session-Id": "odd"})
                    assert r.status_code == 400, (path, field, r.status_code, r.text[:300])
                    assert field in r.text and ("U+0000" in r.text or "surrogate" in r.text), r.text[:300]
                assert await engine.store.info(SessionKey("local", "odd")) is None  # nothing half-stored
                if backend == "postgres":
                    # Data the store itself refuses is not reported as "try again" (50301).
                    with pytest.raises(StoreRefused) as refused:
                        await engine.store.append(SessionKey("local", "nul"), [NewTurn(role="user", content="a\x00b", tokens=1)])
                    row = code_for_exception(refused.value)
                    assert (row.code, http_status(row.code)) == (50002, 500)
                    assert "try again" not in public_message(refused.value, row)
            finally:
                await engine.close()


async def test_record_refuses_what_no_store_can_keep(tmp_path: Path) -> None:
    memory = ContextMode(store=f"sqlite:///{tmp_path / 'm.db'}")
    try:
        with pytest.raises(InputError, match="U\\+0000"):
            await memory.arecord("s1", "user", "a\x00b")
        with pytest.raises(InputError, match="surrogate"):
            await memory.arecord("s1", "assistant", "\ud800")
        assert await memory.engine.store.info(SessionKey("local", "s1")) is None
    finally:
        await memory.aclose()
