"""Two workers, one session: 10 concurrent posts become 10 ordered pairs, on SQLite,
PostgreSQL and Redis; an Idempotency-Key retried on the other worker stores the turn once.

Each test starts the stub model server (200 ms to the first token) and 2 uvicorn
workers (`contextmode.testing.worker.Cluster`). Needs the servers for PostgreSQL and
Redis (skipped when absent, failed under a truthy ``CI``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import httpx
import pytest

from contextmode.store.factory import open_store
from contextmode.testing.backends import fresh_store_url
from contextmode.testing.worker import Cluster
from contextmode.types import SessionKey

pytestmark = pytest.mark.slow

POSTS = 10


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("redis", marks=pytest.mark.redis),
    ]
)
async def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    async with fresh_store_url(request.param, tmp_path) as url:
        yield url


async def test_two_workers_serialise_one_session_and_replay_idempotent_retries(
    store_url: str, tmp_path: Path
) -> None:
    cluster = Cluster(
        workers=2,
        store_url=store_url,
        log_dir=tmp_path / "logs",
        env={"CONTEXTMODE_SESSION_WAIT_MS": "120000"},
        stub_latency_ms=200,
    )
    await asyncio.to_thread(cluster.start)
    session = f"serial-{uuid.uuid4().hex[:8]}"
    sent = [f"message number {i} about tea" for i in range(POSTS)]
    try:
        async with httpx.AsyncClient(timeout=120) as client:
            urls = cluster.urls

            async def post(i: int) -> httpx.Response:
                body = {"message": sent[i], "stream": i % 3 == 0}
                return await client.post(f"{urls[i % 2]}/v1/sessions/{session}/messages", json=body)

            replies = await asyncio.gather(*(post(i) for i in range(POSTS)))
            assert [r.status_code for r in replies] == [200] * POSTS, [r.text[:200] for r in replies]

            # A retry with the same key on the other worker: the first result, stored once.
            retry_session = f"{session}-retry"
            path = f"/v1/sessions/{retry_session}/messages"
            headers = {"Idempotency-Key": f"k-{session}"}
            first, during = await asyncio.gather(
                client.post(f"{urls[0]}{path}", json={"message": "hello"}, headers=headers),
                _after(0.1, client.post(f"{urls[1]}{path}", json={"message": "hello"}, headers=headers)),
            )
            assert first.status_code == 200
            # Still running (40904) or already finished (replayed): never a second turn.
            assert (during.status_code == 409 and during.json()["code"] == 40904) or during.json() == first.json()
            again = await client.post(f"{urls[1]}{path}", json={"message": "hello"}, headers=headers)
            assert again.json() == first.json() and again.headers["idempotent-replayed"] == "true"
            changed = await client.post(f"{urls[1]}{path}", json={"message": "hello?"}, headers=headers)
            assert changed.status_code == 409 and changed.json()["code"] == 40903
    finally:
        await asyncio.to_thread(cluster.stop)

    store = open_store(store_url)
    try:
        turns = await store.turns(SessionKey("local", session))
        retried = await store.turns(SessionKey("local", f"{session}-retry"))
    finally:
        await store.close()
    assert [t.role for t in turns] == ["user", "assistant"] * POSTS
    for question, answer in zip(turns[::2], turns[1::2], strict=True):
        assert answer.metadata["reply_to"] == question.seq
        assert question.content in answer.content  # the stub answers the message it was sent
    assert sorted(t.content for t in turns[::2]) == sorted(sent)
    assert [t.role for t in retried] == ["user", "assistant"]


async def _after(delay_s: float, request: Awaitable[httpx.Response]) -> httpx.Response:
    await asyncio.sleep(delay_s)
    return await request
