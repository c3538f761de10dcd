"""Secrets: the service's API keys and the LLM API key never appear in logs (any logger, any
level), responses (bodies and headers, errors included), the inspector's endpoints, job
stats, ``/metrics``, or a ``repr`` — even when the model provider echoes the key back.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")

from contextmode.api import build_engine
from contextmode.engine import Engine
from contextmode.models.settings import LLMSettings
from contextmode.service import ServiceSettings, create_app
from contextmode.service.auth import ApiKeys
from contextmode.store import MemoryStore
from contextmode.testing.stub_server import StubRequest, StubServer

KEY_A = "svc-key-alpha-6f1c2d9e8b7a"
KEY_B = "svc-key-bravo-0a9b8c7d6e5f"
LLM_KEY = "sk-llmsecret-4c3b2a1908f7e6d5"
SECRETS = (KEY_A, KEY_B, LLM_KEY)
PARTS = (KEY_A[-12:], KEY_B[-12:], LLM_KEY[3:15])
"""Pieces of each secret: the service never echoes a presented key, even in part, and the
LLM key's body never shows (a provider's own masked form, ``sk-…e6d5``, may)."""


def reply(request: StubRequest) -> str:
    system = str(request.messages[0].get("content", "")) if request.messages else ""
    if "intensity" in system or "强度" in system:
        return '{"intensity": 0.2}'
    if "extract" in system or "提取" in system:
        return '{"upsert": [], "remove": []}'
    return f"answer to {request.last_user}"


@pytest.fixture
def stub() -> Iterator[StubServer]:
    server = StubServer(reply)
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def service(
    stub: StubServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, Engine]]:
    monkeypatch.setenv("CONTEXTMODE_API_KEYS", f"{KEY_A}:tenant-a,{KEY_B}:tenant-b")
    monkeypatch.setenv("CONTEXTMODE_IMAGE_DIR", str(tmp_path / "img"))
    monkeypatch.setenv("CONTEXTMODE_LLM_MODEL", "stub-model")
    monkeypatch.setenv("CONTEXTMODE_LLM_BASE_URL", stub.url)
    monkeypatch.setenv("CONTEXTMODE_LLM_API_KEY", LLM_KEY)
    monkeypatch.setenv("CONTEXTMODE_LLM_MAX_RETRIES", "0")
    monkeypatch.setenv("CONTEXTMODE_LLM_TIMEOUT", "2")
    monkeypatch.setenv("CONTEXTMODE_JOB_ATTEMPTS", "1")
    engine = build_engine(store=MemoryStore(), processors="llm")
    app = create_app(engine, ServiceSettings.from_env())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test", timeout=30) as client:
        yield client, engine
    await engine.close()


def leaks(text: str) -> list[str]:
    return [s for s in (*SECRETS, *PARTS) if s in text]


def response_text(response: httpx.Response) -> str:
    return response.text + "\n" + "\n".join(f"{k}: {v}" for k, v in response.headers.items())


def all_logged(caplog: pytest.LogCaptureFixture) -> str:
    """Every record as a handler would write it, with arguments, extras and tracebacks."""
    out = []
    for record in caplog.records:
        out.append(record.getMessage())
        out.append(repr(record.__dict__))
        if record.exc_info and record.exc_info[1] is not None:
            out.append("".join(traceback.format_exception(record.exc_info[1])))
    return "\n".join(out)


async def test_keys_never_appear_in_logs_responses_inspector_or_metrics(
    service: tuple[httpx.AsyncClient, Engine], stub: StubServer, caplog: pytest.LogCaptureFixture
) -> None:
    client, engine = service
    caplog.set_level(logging.DEBUG)  # every logger, openai's and httpx's included
    a = {"authorization": f"Bearer {KEY_A}"}
    b = {"x-api-key": KEY_B}
    seen: list[str] = []

    async def call(method: str, url: str, **kwargs: Any) -> httpx.Response:
        response = await client.request(method, url, **kwargs)
        seen.append(response_text(response))
        return response

    # ordinary traffic, both key styles, both chat routes, streamed and not
    assert (await call("POST", "/v1/sessions/s1/messages", json={"message": "我不吃辣"}, headers=a)).status_code == 200
    await call("POST", "/v1/sessions/s1/messages", json={"message": "推荐一家店", "stream": True}, headers=a)
    await call("POST", "/v1/sessions/s2/messages", json={"message": "hello"}, headers=b)
    await call(
        "POST", "/v1/chat/completions",
        json={"model": "x", "messages": [{"role": "user", "content": "hi"}], "stream": True},
        headers={**a, "x-session-id": "s3"},
    )
    # a provider that echoes the key back in its errors, on the reply path and in the jobs
    for status in (401, 429, 500):
        stub.fail_next(status, count=2, message=f"Incorrect API key provided: {LLM_KEY}. Masked: sk-llm************{LLM_KEY[-4:]}")
        await call("POST", "/v1/sessions/s1/messages", json={"message": f"fault {status}"}, headers=a)
        await call("POST", "/v1/sessions/s1/messages", json={"message": f"fault {status} sse", "stream": True}, headers=a)
    stub.fail_next(401, count=10, message=f"bad key {LLM_KEY}")
    await call("POST", "/v1/sessions/s4/messages", json={"message": "jobs will fail"}, headers=a)
    await engine.drain()
    stub.malformed_next()
    await call("POST", "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]},
               headers={**a, "x-session-id": "s3"})
    # wrong keys that look like the real ones, in every header form
    for bad in (KEY_A[:-1], KEY_A + "0", LLM_KEY, f"{KEY_A},{KEY_B}"):
        await call("GET", "/v1/sessions", headers={"authorization": f"Bearer {bad}"})
        await call("GET", "/v1/sessions", headers={"x-api-key": bad})
        await call("POST", "/v1/chat/completions", json={"messages": []}, headers={"authorization": f"Bearer {bad}"})
    # the inspector's reads, listing, ops endpoints
    for sid in ("s1", "s4"):
        session = await call("GET", f"/v1/sessions/{sid}", headers=a)
        assert session.status_code == 200
        await call("GET", f"/v1/sessions/{sid}/context", params={"message": "那家店呢"}, headers=a)
    jobs = (await client.get("/v1/sessions/s4", headers=a)).json()["data"]["stats"]["jobs"]
    assert any(j["failed"] for j in jobs.values()), jobs  # the failure is visible…
    await call("GET", "/v1/sessions", headers=a)
    await call("GET", "/metrics")
    await call("GET", "/healthz")
    await call("GET", "/openapi.json")
    await call("GET", "/")
    await engine.drain()

    for text in seen:
        assert not leaks(text), (leaks(text), text[:500])
    logged = all_logged(caplog)
    assert len(caplog.records) > 50  # the logs were captured at all
    assert not leaks(logged), [r.getMessage()[:300] for r in caplog.records if leaks(all_logged_one(r))]
    # …and the stub did receive the key: it was sent where it belongs, and only there
    assert any(r.headers.get("authorization") == f"Bearer {LLM_KEY}" for r in stub.chat_requests)


def all_logged_one(record: logging.LogRecord) -> str:
    return record.getMessage() + repr(record.__dict__)


def test_reprs_hide_the_keys() -> None:
    settings = ServiceSettings(api_keys={KEY_A: "a", KEY_B: "b"})
    llm = LLMSettings(model="m", base_url="http://127.0.0.1:1/v1", api_key=LLM_KEY)
    from contextmode.models.openai import OpenAIChatModel

    model = OpenAIChatModel(model="m", base_url="http://127.0.0.1:1/v1", api_key=LLM_KEY)
    for obj in (settings, llm, model, ApiKeys({KEY_A: "a"})):
        assert not leaks(repr(obj)) and not leaks(str(obj)), repr(obj)


def test_a_bad_key_spec_does_not_echo_the_key() -> None:
    from contextmode.errors import ConfigError
    from contextmode.service.settings import parse_api_keys

    with pytest.raises(ConfigError) as info:
        parse_api_keys(f"{KEY_A}")  # no tenant
    assert KEY_A not in str(info.value)
