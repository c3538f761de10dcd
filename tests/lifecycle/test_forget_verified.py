"""Forget, verified per backend: 1,000 planted strings, two workers, every table/key, cache and file scanned.

User ``alice`` talks in 3 sessions and ``bob`` in 1, through two service
workers (separate engines, store connections and recall caches) that both
serve alice. After ``DELETE /v1/users/alice`` on one worker and a deletion-log
poll on the other, none of alice's strings may be found anywhere: any table
or key of the store (SQLite: also the raw database and WAL bytes), either
worker's recall index, pending jobs or summary cache, or the image folder;
every one of bob's strings must still be there. Every message is sent with an
``Idempotency-Key``, so the stored responses are scanned (and erased) too.
"""

from __future__ import annotations

import base64
import random
import sqlite3
import string
from collections import deque
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from contextmode.api import build_engine
from contextmode.engine import Engine
from contextmode.lifecycle import ForgetWatcher
from contextmode.service.app import create_app
from contextmode.service.settings import ServiceSettings
from contextmode.settings import EngineSettings
from contextmode.store import open_store
from contextmode.store.base import Store
from contextmode.store.postings import has_postings
from contextmode.testing.backends import Backend, fresh_store_url
from contextmode.types import SessionKey

_PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 32).decode()
_PER_MESSAGE = 10


def _planted(count: int, rng: random.Random) -> list[str]:
    # Lower-case letters only, ending in "q": one token for the recall analyser, which
    # lower-cases and strips English suffixes, so the index holds them verbatim.
    return [f"zq{''.join(rng.choices(string.ascii_lowercase, k=10))}q" for _ in range(count)]


def _strings_in(root: object) -> set[str]:
    """Every string reachable from ``root`` (dicts, sequences, objects, closures), not
    following into stores, engines or drivers."""
    seen: set[int] = set()
    found: set[str] = set()
    todo: deque[object] = deque([root])
    while todo:
        obj = todo.popleft()
        if id(obj) in seen or obj is None or isinstance(obj, (int, float, bool, bytes)):
            continue
        seen.add(id(obj))
        if isinstance(obj, str):
            found.add(obj)
            continue
        module = type(obj).__module__
        if isinstance(obj, (Engine, Store)) or module.startswith(
            ("asyncpg", "redis", "sqlite3", "concurrent", "threading", "asyncio", "logging", "_asyncio")
        ):
            continue
        if isinstance(obj, dict):
            todo.extend(obj.keys())
            todo.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset, deque)):
            todo.extend(obj)
        elif callable(obj) and getattr(obj, "__closure__", None):
            todo.extend(cell.cell_contents for cell in obj.__closure__ or ())
        elif hasattr(obj, "dtype"):
            if getattr(getattr(obj, "dtype", None), "kind", "") == "O":
                todo.extend(obj.tolist())  # type: ignore[attr-defined]
        elif hasattr(obj, "__dict__"):
            todo.extend(vars(obj).values())
        elif hasattr(obj, "__slots__"):
            todo.extend(getattr(obj, s) for s in obj.__slots__ if hasattr(obj, s))  # type: ignore[union-attr]
    return found


def _cache_text(engine: Engine) -> str:
    roots = [engine.recaller, engine.pending_summaries, engine.jobs]
    return "\n".join(_strings_in(roots))


async def _store_text(backend: Backend, url: str) -> str:
    """Everything the backend holds under the test's name space, as text."""
    if backend == "sqlite":
        path = url.removeprefix("sqlite:///")
        db = sqlite3.connect(path)
        try:
            tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            rows = [repr(row) for t in tables for row in db.execute(f'SELECT * FROM "{t}"')]
        finally:
            db.close()
        raw = b"".join(Path(p).read_bytes() for p in (path, f"{path}-wal") if Path(p).exists())
        return "\n".join(rows) + raw.decode("utf-8", "replace")
    if backend == "postgres":
        import asyncpg

        dsn, _, schema = url.partition("?schema=")
        conn = await asyncpg.connect(dsn)
        try:
            tables = [r["tablename"] for r in await conn.fetch(
                "SELECT tablename FROM pg_tables WHERE schemaname = $1", schema)]
            rows = [r[0] for t in tables for r in await conn.fetch(f'SELECT t::text FROM "{schema}"."{t}" t')]
        finally:
            await conn.close()
        return "\n".join(rows)
    import redis.asyncio as aioredis

    base, _, namespace = url.partition("?namespace=")
    # Raw replies: the recall index holds packed numbers beside its terms (field names).
    client = aioredis.Redis.from_url(base)
    parts: list[str] = []
    try:
        async for key in client.scan_iter(match=f"{namespace}*", count=1000):
            kind = _text(await client.type(key))
            value: Any = {
                "hash": client.hgetall, "zset": lambda k: client.zrange(k, 0, -1, withscores=True),
                "set": client.smembers, "list": lambda k: client.lrange(k, 0, -1), "string": client.get,
            }[kind](key)
            parts.append(f"{_text(key)} {_text(await value)!r}")
    finally:
        await client.aclose()
    return "\n".join(parts)


def _text(value: Any) -> Any:
    """Redis reply bytes as text (undecodable bytes replaced), in containers too."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {_text(k): _text(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_text(v) for v in value]
    return value


def _hits(strings: Iterable[str], text: str) -> list[str]:
    return [s for s in strings if s in text]


async def _converse(clients: list[httpx.AsyncClient], session: str, user: str, strings: list[str],
                    *, image: bool) -> None:
    for i in range(0, len(strings), _PER_MESSAGE):
        chunk = " ".join(strings[i : i + _PER_MESSAGE])
        body: dict[str, Any] = {"message": f"记住这些 {chunk}", "user_id": user}
        if image and i == 0:
            body["images"] = [f"data:image/png;base64,{_PNG}"]
        # Every turn is sent with an Idempotency-Key: its stored response must go with the session.
        r = await clients[(i // _PER_MESSAGE) % len(clients)].post(
            f"/v1/sessions/{session}/messages", json=body, headers={"Idempotency-Key": f"{session}-{i}"}
        )
        assert r.status_code == 200, r.text


async def _plant(clients: list[httpx.AsyncClient], engines: list[Engine], alice: dict[str, list[str]],
                 bob: list[str], image_dir: Path) -> None:
    for session, strings in alice.items():
        await _converse(clients, session, "alice", strings, image=True)
    await _converse(clients, "bob-1", "bob", bob, image=False)
    for engine in engines:
        await engine.drain()
    alice_all = [s for strings in alice.values() for s in strings]
    # Both workers hold alice's words before the forget (so the cache check means something),
    # unless the store keeps the recall index itself (SQLite, PostgreSQL: no turn text is
    # cached in the worker; the scan of the store's own tables covers the postings).
    for engine in engines:
        if not has_postings(engine.store):
            assert _hits(alice_all, _cache_text(engine)), "worker caches were never filled"
    # A crash left one image temp file behind: the turn's metadata names it.
    first = (await engines[0].store.turns(SessionKey("local", "alice-0"), from_seq=1, to_seq=1))[0]
    leftover = Path(first.metadata["images"][0]["path"])
    assert leftover.parent == image_dir
    leftover.write_bytes(alice_all[0].encode())
    users = (await clients[1].get("/v1/users")).json()["data"]["users"]
    assert {(u["user_id"], u["sessions"]) for u in users} == {("alice", 3), ("bob", 1)}
    mine = (await clients[0].get("/v1/sessions", params={"user_id": "alice"})).json()["data"]
    assert sorted(s["session_id"] for s in mine["sessions"]) == sorted(alice)


async def _forget_alice(clients: list[httpx.AsyncClient], engines: list[Engine]) -> None:
    r = await clients[0].delete("/v1/users/alice")
    assert r.status_code == 200, r.text
    counts = r.json()["data"]["counts"]
    assert (counts["sessions"], counts["turns"], counts["images"]) == (3, 150, 1)
    assert counts["emotion_scores"] >= 75
    # The recall index went too: the store's postings, or this worker's in-process index.
    if has_postings(engines[0].store):
        assert counts["recall_postings"] >= 1 and counts["traces"] >= 1, counts
    else:
        assert counts["recall_cache"] >= 1
    # The other worker learns of it from the deletion log.
    assert await ForgetWatcher(engines[1].store, engines[1]).poll() >= 1
    for engine in engines:
        await engine.drain()


async def _assert_only_bob_left(backend: Backend, url: str, engines: list[Engine], image_dir: Path,
                                alice_all: list[str], bob: list[str]) -> None:
    text = await _store_text(backend, url)
    assert _hits(alice_all, text) == []
    assert _hits(bob, text) == bob
    for engine in engines:
        assert _hits(alice_all, _cache_text(engine)) == []
    files = b"".join(p.read_bytes() for p in image_dir.glob("*")) if image_dir.exists() else b""
    assert _hits(alice_all, files.decode("utf-8", "replace")) == []
    bob_turns = await engines[1].store.turns(SessionKey("local", "bob-1"))
    assert _hits(bob, " ".join(t.content for t in bob_turns)) == bob


@pytest.mark.parametrize("backend", ["sqlite", "postgres", "redis"])
async def test_forget_user_leaves_no_trace_anywhere(backend: Backend, tmp_path: Path) -> None:
    planted = _planted(1000, random.Random(7))
    alice = {f"alice-{k}": planted[k * 250 : (k + 1) * 250] for k in range(3)}
    alice_all, bob = planted[:750], planted[750:]
    image_dir = tmp_path / "images"
    settings = ServiceSettings(image_dir=image_dir, forget_sync_s=0)
    engine_settings = replace(EngineSettings(), strategy="hybrid_recall")
    async with fresh_store_url(backend, tmp_path) as url:
        engines = [build_engine(store=open_store(url), settings=engine_settings) for _ in range(2)]
        clients = [httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(e, settings)),
                                     base_url="http://test", timeout=60) for e in engines]
        try:
            await _plant(clients, engines, alice, bob, image_dir)
            await _forget_alice(clients, engines)
            await _assert_only_bob_left(backend, url, engines, image_dir, alice_all, bob)
            # Idempotent: again, nothing left to erase; the audit log has both, no content.
            again = (await clients[1].delete("/v1/users/alice")).json()["data"]
            assert again["counts"].get("sessions", 0) == 0 and again["counts"].get("turns", 0) == 0
            log = (await clients[0].get("/v1/deletions")).json()["data"]["deletions"]
            assert [d["target"] for d in log] == ["alice", "alice"]
            assert log[0]["counts"]["idempotency"] == 75  # one stored response per message sent
            assert all(d["finished_at"] for d in log)
        finally:
            for client in clients:
                await client.aclose()
            for engine in engines:
                await engine.close()
