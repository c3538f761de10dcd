"""Recall speed: selecting recall turns at 1,000 / 10,000 / 100,000 stored turns, and indexing one turn.

Turns are synthetic chat lines whose words follow a Zipf law over a 20,000-word
vocabulary (common words occur in a large share of turns, as in real chat),
mixed with Chinese lines; queries are 4–10 words drawn the same way. Timed:

- ``select``: `Recaller.recall` on a warm session: BM25 search, pseudo-relevance
  feedback search, neighbour expansion and reading the chosen turns from the
  in-memory store (what the engine does per message);
- ``index``: `BM25Index.add` of one new turn into the 100,000-turn index.

Goals (issue 6): select < 20 ms at 100,000 turns, index < 1 ms a turn.

Stores that keep the index (``BENCH_BACKENDS``, default ``sqlite,postgres,redis``; the
PostgreSQL DSN from ``CONTEXTMODE_TEST_PG_DSN``, Redis from ``CONTEXTMODE_TEST_REDIS_URL``),
on a 100,000-turn session:

- ``cold_ms.<backend>``: the first `Recaller.recall` of a worker that has never
  seen the session (a new store connection and a new recaller: nothing cached in
  the process; the database's own page cache is warm, as on a server), median
  over several workers and queries;
- ``select_ms_stored.<backend>``: later recalls of the same worker (sealed blocks
  cached, the open block read from the store);
- ``append_extra_ms.<backend>``: what indexing adds to appending one turn, p50 of
  appends with the index minus p50 without (index writing switched off), interleaved.

Goals (issue 16): cold ≤ 50 ms, select ≤ 5 ms at 100,000 turns, append extra ≤ 0.5 ms.

Semantic query expansion (`RecallSettings.semantic_neighbours`) adds terms only for English
words the shipped thesaurus knows, so with the default made-up vocabulary it adds none.
``BENCH_VOCAB=english`` draws the vocabulary from the thesaurus's own terms instead (common
English words, roughly the most common first, so a query's words have neighbours that occur in the
turns), and every timing is then also taken with expansion off, alternating query by query
(and worker by worker for ``cold_ms``): the ``*_no_expansion`` figures.
Last line: a JSON object with the medians. ``--append-only``: only ``append_extra_ms`` (and
``append_ms``) of the stored backends, on the same 100,000-turn sessions (no in-memory part,
no queries), for comparing appends between two versions quickly.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from contextmode.memory.recall import Recaller, RecallSettings
from contextmode.memory.recall.index import BM25Index
from contextmode.memory.recall.semantic import default_thesaurus
from contextmode.store.base import Store
from contextmode.store.memory import MemoryStore
from contextmode.store.sqlite import SQLiteStore
from contextmode.types import NewTurn, SessionKey, Turn

SIZES = (1_000, 10_000, 100_000)
QUERIES = 60
_ZH = ["我妹妹下个月结婚", "明天去医院复查", "周末想去爬山", "这个按钮在哪里", "预算五十元以内", "不要辣的菜"]


ENGLISH = os.environ.get("BENCH_VOCAB", "") == "english"
"""Real English words (the thesaurus's terms), and each timing also without expansion."""
SETTINGS = {"": RecallSettings(), "_no_expansion": RecallSettings(semantic_neighbours=0)}
VARIANTS = list(SETTINGS) if ENGLISH else [""]


def _vocabulary(rng: random.Random, size: int = 20_000) -> tuple[list[str], list[float]]:
    if ENGLISH:
        words = list(default_thesaurus().terms[:size])  # WordPiece order: roughly common first
    else:
        letters = "abcdefghijklmnopqrstuvwxyz"
        words = ["".join(rng.choice(letters) for _ in range(rng.randint(3, 9))) for _ in range(size)]
    weights = [1.0 / (rank + 1) ** 1.07 for rank in range(len(words))]
    return words, weights


def _line(rng: random.Random, words: list[str], weights: list[float]) -> str:
    if rng.random() < 0.15:
        return rng.choice(_ZH) + "，" + rng.choice(_ZH)
    return " ".join(rng.choices(words, weights, k=rng.randint(5, 40)))


async def _store_with(n: int, rng: random.Random, words: list[str], weights: list[float]) -> MemoryStore:
    store = MemoryStore()
    t0 = datetime(2024, 1, 1, tzinfo=UTC)
    batch = 5_000
    for start in range(0, n, batch):
        await store.append(SessionKey("bench", "s"), [
            NewTurn(role="user" if (start + i) % 2 == 0 else "assistant",
                    content=_line(rng, words, weights), tokens=20,
                    created_at=t0 + timedelta(minutes=start + i))
            for i in range(min(batch, n - start))
        ])
    return store


async def _bench() -> dict[str, object]:
    rng = random.Random(6)
    words, weights = _vocabulary(rng)
    select_ms: dict[str, float] = {}
    build_s: dict[str, float] = {}
    index_ms = 0.0
    for n in SIZES:
        store = await _store_with(n, rng, words, weights)
        recaller = Recaller()
        state = await store.load(SessionKey("bench", "s"), recent=8)
        started = time.perf_counter()
        index = await recaller.index(store, "bench", "s", last_seq=state.last_seq)
        build_s[str(n)] = round(time.perf_counter() - started, 3)
        queries = [" ".join(rng.choices(words, weights, k=rng.randint(4, 10))) for _ in range(QUERIES)]
        queries[::5] = [rng.choice(_ZH) for _ in queries[::5]]
        timings: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for query in queries:
            for variant in VARIANTS:  # alternating, query by query
                recaller.settings = SETTINGS[variant]
                started = time.perf_counter()
                await recaller.recall(store, state, query, limit=128)
                timings[variant].append((time.perf_counter() - started) * 1000)
        for variant, times in timings.items():
            select_ms[f"{n}{variant}"] = round(statistics.median(times), 3)
            print(f"{n:>7} turns{variant}: index built in {build_s[str(n)]:.2f} s, select median "
                  f"{select_ms[f'{n}{variant}']:.2f} ms (p90 {sorted(times)[int(0.9 * len(times))]:.2f} ms)")
        if n == SIZES[-1] and isinstance(index, BM25Index):
            adds = []
            for i in range(1, 2001):
                turn = Turn(seq=n + i, role="user", content=_line(rng, words, weights), tokens=20,
                            created_at=datetime(2025, 1, 1, tzinfo=UTC))
                started = time.perf_counter()
                index.add(turn)
                adds.append((time.perf_counter() - started) * 1000)
            index_ms = round(statistics.median(adds), 4)
            print(f"index one new turn at {n} turns: median {index_ms:.4f} ms")
    return {
        "select_ms": select_ms,
        "index_turn_ms": index_ms,
        "build_s": build_s,
        "goal_select_ms_100k": 20,
        "goal_index_turn_ms": 1,
    }


async def _stored_store(backend: str) -> tuple[Store, Callable[[], Store], Callable[[], Awaitable[None]]]:
    """A store of ``backend``, a factory of more connections to it, and a cleanup."""
    if backend == "sqlite":
        folder = tempfile.mkdtemp(prefix="bench-recall-")
        path = os.path.join(folder, "bench.db")

        async def drop_file() -> None:
            shutil.rmtree(folder, ignore_errors=True)

        return SQLiteStore(path), lambda: SQLiteStore(path), drop_file
    if backend == "postgres":
        from contextmode.store.postgres import PostgresStore

        dsn = os.environ.get("CONTEXTMODE_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
        schema = f"bench_recall_{uuid.uuid4().hex[:8]}"
        first = PostgresStore(dsn, schema=schema, max_size=2)

        async def drop_schema() -> None:
            import asyncpg

            conn = await asyncpg.connect(dsn)
            try:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            finally:
                await conn.close()

        return first, lambda: PostgresStore(dsn, schema=schema, max_size=2), drop_schema
    if backend == "redis":
        from contextmode.store.redis import RedisStore

        url = os.environ.get("CONTEXTMODE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
        namespace = f"bench-recall-{uuid.uuid4().hex[:8]}:"

        async def drop_keys() -> None:
            import redis.asyncio as aioredis

            client = aioredis.Redis.from_url(url)
            try:
                keys = [k async for k in client.scan_iter(match=f"{namespace}*", count=1000)]
                for start in range(0, len(keys), 1000):
                    await client.delete(*keys[start : start + 1000])
            finally:
                await client.aclose()

        return RedisStore(url, namespace=namespace), lambda: RedisStore(url, namespace=namespace), drop_keys
    raise SystemExit(f"unknown backend {backend!r} (sqlite, postgres, redis)")


def _index_switch(backend: str) -> list[tuple[object, str, Callable[..., object]]]:
    """What writes the backend's postings during an append, and its stand-in that writes
    none: ``(module or class, attribute, stand-in)``."""
    if backend == "redis":  # the class whose ``index_head`` reads what the postings need
        from contextmode.store.redis.postings import IndexHead, RedisPostings

        async def lagging(*args: object) -> object:  # no read first, and a session whose index lags
            return IndexHead(last=0, previous=None, indexed_seq=-1)

        return [(RedisPostings, "index_head", lagging)]

    async def skip(*args: object) -> object:
        return False

    if backend == "sqlite":
        from contextmode.store.sqlite import postings as _sqlite_postings

        return [(_sqlite_postings, "index_turns", lambda *args: None)]
    from contextmode.store.postgres import postings as _pg_postings

    # The append statement writes the postings (`append_args`); `index_turns` redoes them
    # when its assumed head was stale, and seals.
    return [(_pg_postings, "append_args", lambda *args: _pg_postings.NO_INDEX),
            (_pg_postings, "index_turns", skip)]


async def _time_queries(
    store: Store, connect: Callable[[], Store], queries: list[str]
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Per variant: cold recalls (ms; a new worker each, the first 7 queries, variants
    alternating worker by worker) and warm ones on ``store`` (alternating query by query)."""
    colds: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for query in queries[:7]:
        for variant in VARIANTS:
            worker = connect()
            state = await worker.load(SessionKey("bench", "s"), recent=8)
            recaller = Recaller(SETTINGS[variant])
            started = time.perf_counter()
            await recaller.recall(worker, state, query, limit=128)
            colds[variant].append((time.perf_counter() - started) * 1000)
            assert not recaller._entries, "the stored index must answer"
            await worker.close()
    warm: dict[str, list[float]] = {v: [] for v in VARIANTS}
    state = await store.load(SessionKey("bench", "s"), recent=8)
    recaller = Recaller()
    await recaller.recall(store, state, queries[0], limit=128)
    for query in queries:
        for variant in VARIANTS:
            recaller.settings = SETTINGS[variant]
            started = time.perf_counter()
            await recaller.recall(store, state, query, limit=128)
            warm[variant].append((time.perf_counter() - started) * 1000)
    return colds, warm


async def _bench_stored(backend: str, n: int = 100_000, *, queries_too: bool = True) -> dict[str, float]:
    rng = random.Random(16)
    words, weights = _vocabulary(rng)
    store, connect, cleanup = await _stored_store(backend)
    try:
        t0 = datetime(2024, 1, 1, tzinfo=UTC)
        started = time.perf_counter()
        for start in range(0, n, 2_000):
            await store.append(SessionKey("bench", "s"), [
                NewTurn(role="user" if (start + i) % 2 == 0 else "assistant",
                        content=_line(rng, words, weights), tokens=20,
                        created_at=t0 + timedelta(minutes=start + i))
                for i in range(min(2_000, n - start))
            ])
        print(f"{backend}: {n} turns written with their postings in {time.perf_counter() - started:.1f} s")
        queries = [" ".join(rng.choices(words, weights, k=rng.randint(4, 10))) for _ in range(QUERIES)]
        queries[::5] = [rng.choice(_ZH) for _ in queries[::5]]
        colds, warm = await _time_queries(store, connect, queries) if queries_too else ({}, {})
        switch = _index_switch(backend)
        indexing = [getattr(owner, name) for owner, name, _ in switch]
        if backend == "redis":  # "s2" is a session whose index lags: its appends write none
            await store.append(SessionKey("bench", "s2"), [NewTurn(role="user", content="first", tokens=1)])
            async with store.driver._guard() as client:  # type: ignore[attr-defined]
                await client.hset(store.driver._keys("bench", "s2")["rindex"], "indexed_seq", -1)  # type: ignore[attr-defined]
        with_index: list[float] = []
        without: list[float] = []
        for i in range(300):
            turn = NewTurn(role="user", content=_line(rng, words, weights), tokens=20)
            use = i % 2 == 0
            for (owner, name, off), on in zip(switch, indexing, strict=True):
                setattr(owner, name, on if use else off)
            started = time.perf_counter()
            await store.append(SessionKey("bench", "s2" if not use else "s"), [turn])
            (with_index if use else without).append((time.perf_counter() - started) * 1000)
        for (owner, name, _), on in zip(switch, indexing, strict=True):
            setattr(owner, name, on)
        result = {
            "append_ms": round(statistics.median(with_index), 3),
            "append_extra_ms": round(statistics.median(with_index) - statistics.median(without), 3),
        }
        for variant in VARIANTS if queries_too else ():
            result[f"cold_ms{variant}"] = round(statistics.median(colds[variant]), 2)
            result[f"select_ms{variant}"] = round(statistics.median(warm[variant]), 2)
            print(f"{backend}{variant}: cold {result[f'cold_ms{variant}']} ms, "
                  f"warm select {result[f'select_ms{variant}']} ms")
        print(f"{backend}: append {result['append_ms']} ms of which indexing {result['append_extra_ms']} ms (p50)")
        return result
    finally:
        await store.close()
        await cleanup()


def main() -> None:
    backends = [b.strip() for b in os.environ.get("BENCH_BACKENDS", "sqlite,postgres,redis").split(",") if b.strip()]
    if "--append-only" in sys.argv[1:]:
        appends = {backend: asyncio.run(_bench_stored(backend, queries_too=False)) for backend in backends}
        print(json.dumps({
            "append_extra_ms": {b: r["append_extra_ms"] for b, r in appends.items()},
            "append_ms": {b: r["append_ms"] for b, r in appends.items()},
            "load_average": round(os.getloadavg()[0], 2),
        }))
        return
    result = asyncio.run(_bench())
    stored = {backend: asyncio.run(_bench_stored(backend)) for backend in backends}
    for variant in VARIANTS:
        result[f"cold_ms{variant}"] = {b: r[f"cold_ms{variant}"] for b, r in stored.items()}
        result[f"select_ms_stored{variant}"] = {b: r[f"select_ms{variant}"] for b, r in stored.items()}
    result["append_extra_ms"] = {b: r["append_extra_ms"] for b, r in stored.items()}
    result["goals_issue16"] = {"cold_ms": 50, "select_ms_100k": 5, "append_extra_ms": 0.5}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
