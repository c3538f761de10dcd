"""Store faults: PostgreSQL or Redis restarted, down, or cut mid-request, behind a TCP proxy.

Each fault must give a clear 50301 envelope (or SSE error event), leave no half-written
turn, and heal by itself when the store is back: no service restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from contextmode.types import SessionKey

pytest.importorskip("fastapi")

from contextmode.api import build_engine
from contextmode.engine import Engine
from contextmode.errors import StoreError
from contextmode.jobs import JobRunner, JobSettings
from contextmode.service import ServiceSettings, create_app
from contextmode.store.base import Store
from contextmode.store.factory import open_store
from contextmode.testing.backends import fresh_store_url
from contextmode.testing.counters import CharTokenCounter
from contextmode.testing.models import FunctionModel
from contextmode.testing.proxy import TcpProxy
from contextmode.types import ChatMessage

TENANT = "local"
SID = "s1"


def _via(url: str, port: int) -> str:
    """``url`` with its host and port replaced by the proxy's."""
    parts = urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    netloc = f"{auth}@127.0.0.1:{port}" if auth else f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


@dataclass
class Backend:
    name: str
    proxy: TcpProxy
    store: Store


@pytest.fixture(params=["postgres", "redis"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    kind = request.param
    request.applymarker(getattr(pytest.mark, kind))
    async with fresh_store_url(kind, tmp_path) as url:
        # The store talks to the server through a proxy the tests can break.
        target = urlsplit(url)
        proxy = TcpProxy(target.port or (5432 if kind == "postgres" else 6379),
                         target_host=target.hostname or "127.0.0.1")
        port = proxy.start()
        store = open_store(_via(url, port) + ("&pool_max=3" if kind == "postgres" else ""))
        yield Backend(name=kind, proxy=proxy, store=store)
        proxy.restore()
        await store.close()
        proxy.stop()


class Answers:
    """The chat model: answers at once, or first runs ``during`` (to break the store mid-turn)."""

    def __init__(self) -> None:
        self.during: Any = None

    def __call__(self, messages: Sequence[ChatMessage]) -> str:
        if self.during is not None:
            action, self.during = self.during, None
            action()
        user = next(m.content for m in reversed(messages) if m.role == "user")
        return f"answer to {user}"


@pytest.fixture
async def service(backend: Backend) -> AsyncIterator[tuple[httpx.AsyncClient, Engine, Answers]]:
    answers = Answers()
    # A job cut off while holding its session lock cannot release it (the store is down): the
    # lock then blocks the session's jobs until it expires. A short TTL keeps the tests quick;
    # in production it is CONTEXTMODE_JOB_LOCK_TTL_S (300 s) — see docs/security.md.
    runner = JobRunner(
        backend.store,
        JobSettings(attempts=3, base_delay_s=0.05, timeout_s=1.0, lock_ttl_s=1.5, lock_attempts=30),
    )
    engine = build_engine(
        store=backend.store, model=FunctionModel(answers), counter=CharTokenCounter(), jobs=runner
    )
    app = create_app(engine, ServiceSettings())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=30) as client:
        yield client, engine, answers
    await engine.jobs.aclose()


async def send(client: httpx.AsyncClient, text: str, *, stream: bool = False) -> httpx.Response:
    async with asyncio.timeout(20):  # a hang is a failure with a traceback, not a stuck suite
        return await client.post(f"/v1/sessions/{SID}/messages", json={"message": text, "stream": stream})


async def drained(engine: Engine) -> None:
    async with asyncio.timeout(20):
        await engine.drain()


def assert_store_unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    body = response.json()
    assert body["code"] == 50301 and body["data"] is None
    # the driver's text (host, port) stays in the log
    assert "store" in body["msg"] and "127.0.0.1" not in body["msg"] and "rrno" not in body["msg"]


async def whole_turns(store: Store) -> list[tuple[int, str, str]]:
    """The session's turns, checked for consistency: contiguous seqs, every answer after its question."""
    info = await store.info(SessionKey(TENANT, SID))
    if info is None:
        return []
    turns = await store.turns(SessionKey(TENANT, SID), from_seq=1, to_seq=info.last_seq)
    assert [t.seq for t in turns] == list(range(1, info.last_seq + 1)), "a gap or a torn append"
    by_seq = {t.seq: t for t in turns}
    for turn in turns:
        if turn.role == "assistant":
            question = by_seq[turn.metadata["reply_to"]]
            assert question.role == "user" and turn.content == f"answer to {question.content}"
    return [(t.seq, t.role, t.content) for t in turns]


async def until_healthy(client: httpx.AsyncClient, tries: int = 5) -> httpx.Response:
    """Send a turn until one works (a pool's stale connection may fail the first)."""
    for i in range(tries):
        response = await send(client, f"after recovery {i}")
        if response.status_code == 200:
            return response
        assert_store_unavailable(response)
    raise AssertionError(f"the store did not recover within {tries} requests")


async def test_restart_between_requests_heals_without_restarting_the_service(
    backend: Backend, service: tuple[httpx.AsyncClient, Engine, Answers]
) -> None:
    client, engine, _ = service
    assert (await send(client, "one")).status_code == 200
    await drained(engine)
    before = await whole_turns(engine.store)
    for _ in range(3):  # three restarts in a row
        assert backend.proxy.drop_all() >= 1
        ok = await until_healthy(client)
        assert ok.json()["data"]["answer"].startswith("answer to after recovery")
        await drained(engine)
    after = await whole_turns(engine.store)
    assert after[: len(before)] == before
    assert len(after) == len(before) + 6


async def test_store_down_every_endpoint_answers_50301_then_recovers(
    backend: Backend, service: tuple[httpx.AsyncClient, Engine, Answers]
) -> None:
    client, engine, _ = service
    assert (await send(client, "one")).status_code == 200
    await drained(engine)
    before = await whole_turns(engine.store)

    backend.proxy.refuse()
    backend.proxy.drop_all()
    for _ in range(2):
        assert_store_unavailable(await send(client, "lost"))
        assert_store_unavailable(await send(client, "lost stream", stream=True))
        assert_store_unavailable(await client.get(f"/v1/sessions/{SID}"))
        assert_store_unavailable(await client.get(f"/v1/sessions/{SID}/context", params={"message": "hi"}))
        assert_store_unavailable(await client.get("/v1/sessions"))
        assert_store_unavailable(await client.delete(f"/v1/sessions/{SID}"))
        assert_store_unavailable(await client.get("/healthz"))
        proxied = await client.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}, headers={"x-session-id": SID}
        )
        assert proxied.status_code == 503 and proxied.json()["error"]["contextmode_code"] == 50301

    backend.proxy.restore()
    await until_healthy(client)
    assert (await client.get("/healthz")).status_code == 200
    await drained(engine)
    after = await whole_turns(engine.store)
    assert after[: len(before)] == before
    assert all(content != "lost" and content != "lost stream" for _, _, content in after)


@pytest.mark.parametrize("stream", [False, True], ids=["envelope", "sse"])
async def test_store_lost_while_the_model_answers_keeps_the_user_turn_only(
    backend: Backend, service: tuple[httpx.AsyncClient, Engine, Answers], stream: bool
) -> None:
    client, engine, answers = service
    assert (await send(client, "one")).status_code == 200
    await drained(engine)
    before = await whole_turns(engine.store)

    def crash() -> None:
        backend.proxy.refuse()
        backend.proxy.drop_all()

    answers.during = crash
    response = await send(client, "cut", stream=stream)
    if stream:
        events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
        assert events[-1]["type"] == "error" and events[-1]["code"] == 50301, events
    else:
        assert_store_unavailable(response)
    await engine.jobs.aclose()  # jobs of the cut turn cannot run against a dead store

    backend.proxy.restore()
    await until_healthy(client)
    await drained(engine)
    after = await whole_turns(engine.store)
    assert after[: len(before)] == before
    # the user turn was stored before the model was called; its answer could not be
    assert after[len(before)] == (len(before) + 1, "user", "cut")
    assert after[len(before) + 1][1:] == ("user", "after recovery 0")
    await assert_jobs_recovered(engine)


@pytest.mark.parametrize("cut_at", [0.0, 0.3, 0.6, 0.8, 0.95])
async def test_connection_cut_at_any_point_of_a_slow_request_leaves_whole_turns(
    backend: Backend, service: tuple[httpx.AsyncClient, Engine, Answers], cut_at: float
) -> None:
    """The cut lands at ``cut_at`` of a slowed request's own duration: before, during or after
    the user turn's append, during the answer's append. Whatever it hits, the turns stay whole."""
    client, engine, _ = service
    assert (await send(client, "one")).status_code == 200
    await drained(engine)
    backend.proxy.delay(0.01)  # every round trip is slow, so the cut lands inside some query
    started = time.perf_counter()
    assert (await send(client, "measure")).status_code == 200
    duration = time.perf_counter() - started
    await drained(engine)
    before = await whole_turns(engine.store)

    request = asyncio.create_task(send(client, "sliced"))
    await asyncio.sleep(duration * cut_at)
    backend.proxy.refuse()
    backend.proxy.drop_all()
    response = await request
    if response.status_code != 200:
        assert_store_unavailable(response)
    await engine.jobs.aclose()

    backend.proxy.restore()
    await until_healthy(client)
    await drained(engine)
    after = await whole_turns(engine.store)  # contiguous, every answer whole and after its question
    assert after[: len(before)] == before
    extra = [content for _, _, content in after[len(before):]]
    assert extra[-2:] == ["after recovery 0", "answer to after recovery 0"] or extra[-1].startswith("after recovery")
    assert extra.count("sliced") <= 1 and extra.count("answer to sliced") <= extra.count("sliced")
    await assert_jobs_recovered(engine)


async def assert_jobs_recovered(engine: Engine) -> None:
    """After the outage the background jobs run again: the latest of each kind succeeded."""
    info = await engine.store.info(SessionKey(TENANT, SID))
    assert info is not None
    for name in ("emotion", "constraints"):
        assert info.jobs[name].last_error is None, (name, info.jobs[name])


async def test_a_slow_store_is_slow_not_broken(
    backend: Backend, service: tuple[httpx.AsyncClient, Engine, Answers]
) -> None:
    client, engine, _ = service
    backend.proxy.delay(0.005)
    for i in range(3):
        response = await send(client, f"slow {i}")
        assert response.status_code == 200, response.text
    await drained(engine)
    backend.proxy.restore()
    assert [c for _, _, c in await whole_turns(engine.store)] == [
        "slow 0", "answer to slow 0", "slow 1", "answer to slow 1", "slow 2", "answer to slow 2"
    ]


def test_proxy_knobs_without_a_store() -> None:
    """The proxy itself: forwards, resets, refuses and listens again on the same port."""
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0))
    target_port = server.getsockname()[1]

    def echo() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=_echo, args=(conn,), daemon=True).start()

    threading.Thread(target=echo, daemon=True).start()
    proxy = TcpProxy(target_port)
    port = proxy.start()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
            conn.sendall(b"ping")
            assert conn.recv(4) == b"ping"
            assert proxy.drop_all() == 1
            with pytest.raises(OSError):
                conn.sendall(b"x" * 65536)
                conn.recv(4) or (_ for _ in ()).throw(ConnectionResetError())
        proxy.refuse()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5)
        proxy.restore()
        with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
            conn.sendall(b"pong")
            assert conn.recv(4) == b"pong"
    finally:
        proxy.stop()
        server.close()


def _echo(conn: Any) -> None:
    with conn, contextlib.suppress(OSError):  # the proxy resets it on purpose
        while data := conn.recv(4096):
            conn.sendall(data)


async def test_a_cancel_during_a_dying_query_stays_a_cancel(backend: Backend) -> None:
    """A job cancelled (shutdown) while its connection dies must end cancelled (or done):
    turned into a StoreError, the cancel would be lost and the job runner would retry on."""
    from contextmode.types import NewTurn

    await backend.store.append(SessionKey(TENANT, SID), [NewTurn(role="user", content="hi", tokens=1)])
    outcomes: list[str] = []
    for cancel_first in (True, False):
        for wait in (0.0, 0.01, 0.03, 0.06):
            backend.proxy.delay(0.02)
            task = asyncio.create_task(backend.store.set_emotions(SessionKey(TENANT, SID), {1: 0.5}))
            await asyncio.sleep(wait)  # before, during or after the write
            if cancel_first:
                task.cancel()
                backend.proxy.drop_all()
            else:
                backend.proxy.drop_all()
                task.cancel()
            try:
                await task
                outcomes.append("done")
            except asyncio.CancelledError:
                outcomes.append("cancelled")
            backend.proxy.restore()
            await until_store_answers(backend.store)
    assert "cancelled" in outcomes


async def until_store_answers(store: Store, tries: int = 5) -> None:
    for _ in range(tries):
        try:
            await store.info(SessionKey(TENANT, SID))
            return
        except StoreError:
            continue
    raise AssertionError("the store did not come back")
