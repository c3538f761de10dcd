"""Tenant isolation: no call with tenant B's key reads, lists, changes or deletes tenant A's
sessions, whatever the session id — on every route of the app (listed from ``app.routes``,
so a new route fails this test until it is added here) and on every store backend.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from contextmode.types import SessionKey

pytest.importorskip("fastapi")

from fastapi import FastAPI
from starlette.routing import Mount, Route

from contextmode.api import build_engine
from contextmode.engine import Engine
from contextmode.service import ServiceSettings, create_app
from contextmode.store import MemoryStore
from contextmode.store.base import Store
from contextmode.store.factory import open_store
from contextmode.store.records import TurnTrace
from contextmode.store.sqlite import SQLiteStore
from contextmode.testing.backends import Backend, fresh_store_url
from contextmode.testing.counters import CharTokenCounter
from contextmode.testing.models import FunctionModel
from contextmode.types import ChatMessage, Constraint, NewTurn, Summary, utc_now

KEY_A, KEY_B = "tenant-a-key-7f3e9c1d", "tenant-b-key-2b8a4e6f"
# Tenants chosen so that naive key concatenation would collide: "acme" + ":x/s" vs "acme:x" + "/s".
TENANT_A, TENANT_B = "acme", "acme:x"
A_SESSIONS = ("a-private", "x:shared", "shared")
MARKER = "A-ONLY-MARKER 机密"
"""Text stored only in tenant A's sessions: it must never reach B, in a response or in B's model calls."""


def all_routes(app: FastAPI) -> Iterator[tuple[str, str]]:
    """``(method, path template)`` of every route, included routers and mounts too."""
    for route in app.routes:
        if isinstance(route, Mount):
            yield "GET", f"{route.path}/{{path}}"
        elif isinstance(route, Route):
            for method in sorted((route.methods or set()) - {"HEAD"}):
                yield method, route.path
        elif hasattr(route, "effective_route_contexts"):  # FastAPI's lazily included routers
            for context in route.effective_route_contexts():
                for method in sorted(set(context.methods or ()) - {"HEAD"}):
                    yield method, context.path
        else:
            raise AssertionError(f"a route of unknown kind {type(route).__name__}: teach this test about it")


# -- stores ---------------------------------------------------------------------------------


async def _service(backend: Backend, tmp: Any) -> AsyncIterator[Store]:
    """A PostgreSQL or Redis store of its own (fresh schema / key prefix, dropped after)."""
    async with fresh_store_url(backend, tmp) as url:
        store = open_store(url)
        yield store
        await store.close()


async def _memory(tmp: Any) -> AsyncIterator[Store]:
    yield MemoryStore()


async def _sqlite(tmp: Any) -> AsyncIterator[Store]:
    store = SQLiteStore(tmp / "tenants.db")
    yield store
    await store.close()


STORES: dict[str, Callable[[Any], AsyncIterator[Store]]] = {
    "memory": _memory, "sqlite": _sqlite,
    "postgres": lambda tmp: _service("postgres", tmp), "redis": lambda tmp: _service("redis", tmp),
}


@dataclass
class World:
    client: httpx.AsyncClient
    engine: Engine
    app: FastAPI
    model: FunctionModel


@pytest.fixture(params=list(STORES))
async def world(request: pytest.FixtureRequest, tmp_path: Any) -> AsyncIterator[World]:
    if request.param in ("postgres", "redis"):
        request.applymarker(getattr(pytest.mark, request.param))
    stores = STORES[request.param](tmp_path)
    store = await anext(stores)
    model = FunctionModel(lambda messages: "ok")
    engine = build_engine(store=store, model=model, counter=CharTokenCounter())
    app = create_app(engine, ServiceSettings(api_keys={KEY_A: TENANT_A, KEY_B: TENANT_B}, image_dir=tmp_path / "img"))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        for sid in A_SESSIONS:
            await store.append(
                SessionKey(TENANT_A, sid),
                [NewTurn(role="user", content=f"{MARKER} in {sid}", tokens=5),
                 NewTurn(role="assistant", content=f"{MARKER} answer", tokens=3)],
                user_id=sid,  # B's DELETE /v1/users/{id} must not reach A's users either
            )
            await store.commit_summary(
                SessionKey(TENANT_A, sid), Summary(text=f"{MARKER} summary", covers_seq=2, tokens=3, created_at=utc_now()),
                expected_version=0,
            )
            await store.commit_constraints(
                SessionKey(TENANT_A, sid), [Constraint(key="secret", value=MARKER, source_seq=1)], expected_version=0
            )
            await store.record_job(SessionKey(TENANT_A, sid), "summary", ok=True)
            await store.put_trace(
                SessionKey(TENANT_A, sid),
                TurnTrace(turn=1, user_seq=1, answer_seq=2, created_at=utc_now(), typed=f"{MARKER} in {sid}",
                          sent=MARKER, messages=(ChatMessage(role="user", content=MARKER),)),
            )
        yield World(client=client, engine=engine, app=app, model=model)
        await engine.drain()
    await anext(stores, None)


async def a_snapshot(store: Store) -> Any:
    out = []
    for sid in A_SESSIONS:
        info = await store.info(SessionKey(TENANT_A, sid))
        assert info is not None, f"A's session {sid} is gone"
        turns = await store.turns(SessionKey(TENANT_A, sid), from_seq=1, to_seq=info.last_seq)
        state = await store.load(SessionKey(TENANT_A, sid), recent=0, max_uncovered=0)
        out.append((
            sid, [(t.seq, t.role, t.content) for t in turns],
            state.summary.text if state.summary else None, [(c.key, c.value) for c in state.constraints],
            info.summary_version, info.constraints_version, {k: (v.ok, v.failed) for k, v in info.jobs.items()},
        ))
    return out


# Session ids B tries: A's own, and variants that a sloppy key scheme could map onto A's.
ATTACK_IDS = [
    *A_SESSIONS, "A-PRIVATE", "acme/a-private", "acme:a-private", "../acme/a-private", "..%2Facme%2Fa-private",
    "x", "x:shared:", "shared.", "s", "%2e%2e", "a;DROP TABLE turns", "*", "acme",
]


def requests_for(method: str, path: str, sid: str) -> list[tuple[str, str, dict[str, Any]]]:
    """The requests that exercise ``method path`` against session ``sid``."""
    quoted = quote(sid, safe="")
    url = path.replace("{session_id}", quoted).replace("{turn}", "1").replace("{user_id}", quoted)  # A's first turn has a kept trace
    table: dict[tuple[str, str], list[dict[str, Any]]] = {
        ("POST", "/v1/sessions/{session_id}/messages"): [
            {"json": {"message": "show me everything you remember"}},
            {"json": {"message": "and the rest", "stream": True}},
        ],
        ("GET", "/v1/sessions/{session_id}/context"): [{"params": {"message": "what did I say before?"}}],
        ("GET", "/v1/sessions/{session_id}"): [{}, {"params": {"limit": 500}}, {"params": {"before": 3}}],
        ("GET", "/v1/sessions/{session_id}/turns/{turn}/context"): [{}],
        ("GET", "/v1/sessions/{session_id}/storage"): [{}],
        ("DELETE", "/v1/sessions/{session_id}"): [{}],
        ("GET", "/v1/sessions"): [{}, {"params": {"limit": 1000, "offset": 0}}, {"params": {"user_id": sid}}],
        ("GET", "/v1/users"): [{}],
        ("DELETE", "/v1/users/{user_id}"): [{}],
        ("GET", "/v1/deletions"): [{}],
        ("POST", "/v1/chat/completions"): [
            {"json": {"messages": [{"role": "user", "content": "repeat our history"}]}, "headers": {"x-session-id": sid}},
            {"json": {"messages": [{"role": "user", "content": "repeat"}], "user": sid, "stream": True}},
        ],
        ("POST", "/v1/messages"): [
            {"json": {"model": "any", "max_tokens": 64, "messages": [{"role": "user", "content": "repeat our history"}]},
             "headers": {"x-session-id": sid}},
            {"json": {"model": "any", "max_tokens": 64, "messages": [{"role": "user", "content": "repeat"}],
                      "metadata": {"user_id": sid}, "stream": True}},
        ],
        ("POST", "/v1/responses"): [
            {"json": {"model": "any", "input": "repeat our history"}, "headers": {"x-session-id": sid}},
            {"json": {"model": "any", "input": [{"role": "user", "content": "repeat"}], "user": sid, "stream": True}},
        ],
        ("POST", "/v1/messages/count_tokens"): [
            {"json": {"model": "any", "messages": [{"role": "user", "content": "what did I say before?"}]},
             "headers": {"x-session-id": sid}},
        ],
        ("GET", "/v1/models"): [{}],
        ("GET", "/healthz"): [{}],
        ("GET", "/metrics"): [{}],
        ("GET", "/"): [{}],
        ("GET", "/static/{path}"): [{}],
        ("GET", "/favicon.ico"): [{}],
        ("GET", "/openapi.json"): [{}],
        ("GET", "/docs"): [{}],
        ("GET", "/docs/oauth2-redirect"): [{}],
        ("GET", "/redoc"): [{}],
    }
    key = (method, path)
    assert key in table, f"route {method} {path} is not covered by the tenant-isolation test: add it to the table"
    if path == "/static/{path}":
        url = "/static/js/app.js"
    return [(method, url, kwargs) for kwargs in table[key]]


async def test_tenant_b_cannot_reach_tenant_a_on_any_route(world: World) -> None:
    client, store = world.client, world.engine.store
    before = await a_snapshot(store)
    routes = sorted(set(all_routes(world.app)))
    assert ("POST", "/v1/sessions/{session_id}/messages") in routes and ("GET", "/v1/sessions") in routes
    tried = 0
    for method, path in routes:
        for sid in ATTACK_IDS:
            for m, url, kwargs in requests_for(method, path, sid):
                for header in ({"authorization": f"Bearer {KEY_B}"}, {"x-api-key": KEY_B}):
                    headers = {**kwargs.get("headers", {}), **header}
                    response = await client.request(m, url, **{**kwargs, "headers": headers})
                    tried += 1
                    assert response.status_code < 500, (m, url, response.text[:300])
                    assert MARKER not in response.text, f"{m} {url} leaked A's data to B"
                    if m == "DELETE" and sid in A_SESSIONS and "{user_id}" in path:
                        # forgetting a user is idempotent: B's tenant has no such user, nothing goes
                        assert response.status_code == 200 and response.json()["data"]["counts"].get("sessions", 0) == 0
                    elif m == "DELETE" and sid in A_SESSIONS:
                        assert response.status_code == 404 and response.json()["code"] == 40401
                    if m == "GET" and path == "/v1/sessions/{session_id}" and sid in A_SESSIONS:
                        # B never wrote there before this route came up, or wrote only its own turns
                        data = response.json().get("data") or {}
                        assert all(MARKER not in t["content"] for t in data.get("turns", []))
            if "{" not in path and path != "/v1/sessions":
                break  # routes without a session or user id: once is enough
    await world.engine.drain()
    assert tried > 200
    assert await a_snapshot(store) == before, "tenant A's sessions changed"
    # nothing of A's reached the model while it answered B
    for call in world.model.calls:
        assert all(MARKER not in m.content for m in call.messages)
    # B's listing holds only what B itself created
    listed = (await client.get("/v1/sessions", params={"limit": 1000}, headers={"x-api-key": KEY_B})).json()
    b_ids = {s["session_id"] for s in listed["data"]["sessions"]}
    for sid in b_ids:
        info = await store.info(SessionKey(TENANT_B, sid))
        assert info is not None
        turns = await store.turns(SessionKey(TENANT_B, sid), from_seq=1, to_seq=info.last_seq)
        assert all(MARKER not in t.content for t in turns)
    # A still sees its own sessions, untouched, and only its own
    mine = (await client.get("/v1/sessions", params={"limit": 1000}, headers={"x-api-key": KEY_A})).json()
    assert {s["session_id"] for s in mine["data"]["sessions"]} == set(A_SESSIONS)
    for sid in A_SESSIONS:
        got = (await client.get(f"/v1/sessions/{quote(sid, safe='')}", headers={"x-api-key": KEY_A})).json()
        assert [t["content"] for t in got["data"]["turns"]] == [f"{MARKER} in {sid}", f"{MARKER} answer"]


async def test_without_a_valid_key_only_public_routes_answer(world: World) -> None:
    public = {"/healthz", "/metrics", "/", "/static/{path}", "/favicon.ico", "/openapi.json", "/docs",
              "/docs/oauth2-redirect", "/redoc"}
    for method, path in sorted(set(all_routes(world.app))):
        for header in ({}, {"authorization": "Bearer nope"}, {"x-api-key": KEY_A + "x"}, {"authorization": f"Basic {KEY_A}"}):
            for m, url, kwargs in requests_for(method, path, "a-private"):
                response = await world.client.request(m, url, **{**kwargs, "headers": {**kwargs.get("headers", {}), **header}})
                assert MARKER not in response.text
                if path in public:
                    assert response.status_code == 200, (m, url)
                    continue
                assert response.status_code == 401, (m, url, header, response.text)
                assert response.headers["www-authenticate"] == "Bearer"
                body = response.json()
                code = body["error"]["contextmode_code"] if "error" in body else body["code"]
                assert code == 40101
    assert len(world.model.calls) == 0


async def test_the_engine_keeps_tenants_apart_below_the_http_layer(world: World) -> None:
    """Same session id, two tenants: each turn, load, listing and delete stays in its tenant."""
    engine = world.engine
    before = await a_snapshot(engine.store)
    await engine.turn(TENANT_B, "shared", "B's own words")
    await engine.drain()
    state = await engine.store.load(SessionKey(TENANT_B, "shared"), recent=50)
    assert [t.content for t in state.turns] == ["B's own words", "ok"]
    assert state.summary is None and not state.constraints
    assert await engine.store.delete(SessionKey(TENANT_B, "a-private")) is False
    assert await engine.store.delete(SessionKey(TENANT_B, "shared")) is True
    assert await a_snapshot(engine.store) == before
