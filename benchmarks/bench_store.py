"""Store latency per backend: median append, median load at 100 and 100,000 stored turns.

    python benchmarks/bench_store.py [--loads 200] [--appends 300] [--big 100000]

Each backend gets two sessions of 100 and ``--big`` turns, seeded in batches of
1,000 through the ordinary `append` (1 % of turns, or 10, scored for emotion, a summary
covering all but the last 12 turns). `load()` asks for the usual window
(recent 8, max 200 uncovered, 5 key moments). The goal is
``load_ratio_100000_vs_100 ≤ 2``: loading must not grow with the history.
PostgreSQL (``CONTEXTMODE_TEST_PG_DSN``) and Redis (``CONTEXTMODE_TEST_REDIS_URL``)
run in a throwaway schema / key namespace and are skipped with a note when
absent. The last line printed is a JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from contextmode.types import SessionKey

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from contextmode.store import MemoryStore, SQLiteStore, Store
from contextmode.types import NewTurn, Summary

PG_DSN = os.environ.get("CONTEXTMODE_TEST_PG_DSN") or "postgresql://postgres@127.0.0.1:5432/test"
REDIS_URL = os.environ.get("CONTEXTMODE_TEST_REDIS_URL") or "redis://127.0.0.1:6379/0"
TENANT = "bench"


def _turns(start: int, count: int) -> list[NewTurn]:
    return [
        NewTurn(
            role="user" if (start + i) % 2 else "assistant",
            content=f"第{start + i}轮: 我们聊聊周末去哪里吃饭, 不要太辣, 预算五十元以内。",
            tokens=24,
        )
        for i in range(count)
    ]


async def _seed(store: Store, session_id: str, count: int) -> None:
    for start in range(1, count + 1, 1000):
        await store.append(SessionKey(TENANT, session_id), _turns(start, min(1000, count - start + 1)))
    step = 10 if count <= 1000 else 100  # 10 scored turns in the small session, 1 % in the big
    scores = {seq: 0.75 + (seq % 7) / 40 for seq in range(5, count + 1, step)}
    for chunk in range(0, len(scores), 500):
        part = dict(list(scores.items())[chunk : chunk + 500])
        await store.set_emotions(SessionKey(TENANT, session_id), part)
    summary = Summary(text="之前的对话摘要。" * 20, covers_seq=count - 12, tokens=160)
    assert await store.commit_summary(SessionKey(TENANT, session_id), summary, expected_version=0)


async def _median_ms(count: int, call: Callable[[], Any]) -> float:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


async def bench(store: Store, *, loads: int, appends: int, big: int) -> dict[str, float]:
    await _seed(store, "small", 100)
    await _seed(store, "big", big)

    async def load(session_id: str) -> None:
        state = await store.load(SessionKey(TENANT, session_id), recent=8, max_uncovered=200, key_moments=5)
        assert len(state.turns) == 12 and len(state.key_moments) == 5, (session_id, state)

    for session_id in ("small", "big"):  # warm caches and connections
        for _ in range(10):
            await load(session_id)
    small = await _median_ms(loads, lambda: load("small"))
    large = await _median_ms(loads, lambda: load("big"))
    counter = iter(range(1, appends + 1))
    append = await _median_ms(
        appends, lambda: store.append(SessionKey(TENANT, "appends"), _turns(next(counter), 1))
    )
    return {
        "append_median_ms": round(append, 4),
        "load_median_ms_100": round(small, 4),
        f"load_median_ms_{big}": round(large, 4),
        f"load_ratio_{big}_vs_100": round(large / small, 3),
    }


@asynccontextmanager
async def _memory() -> AsyncIterator[Store]:
    yield MemoryStore()


@asynccontextmanager
async def _sqlite() -> AsyncIterator[Store]:
    with tempfile.TemporaryDirectory() as folder:
        store = SQLiteStore(Path(folder) / "bench.db")
        try:
            yield store
        finally:
            await store.close()


@asynccontextmanager
async def _postgres() -> AsyncIterator[Store]:
    import asyncpg

    from contextmode.store.postgres import PostgresStore

    admin = await asyncpg.connect(PG_DSN, timeout=3)
    schema = f"cm_bench_{uuid.uuid4().hex[:10]}"
    store = PostgresStore(PG_DSN, schema=schema, max_size=2)
    try:
        yield store
    finally:
        await store.close()
        await admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await admin.close()


@asynccontextmanager
async def _redis() -> AsyncIterator[Store]:
    import redis.asyncio as aioredis

    from contextmode.store.redis import RedisStore

    admin = aioredis.Redis.from_url(REDIS_URL, socket_connect_timeout=3)
    await admin.ping()
    namespace = f"cmbench:{uuid.uuid4().hex[:10]}:"
    store = RedisStore(REDIS_URL, namespace=namespace)
    try:
        yield store
    finally:
        await store.close()
        keys = [k async for k in admin.scan_iter(match=f"{namespace}*", count=1000)]
        for i in range(0, len(keys), 1000):
            await admin.delete(*keys[i : i + 1000])
        await admin.aclose()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--loads", type=int, default=200)
    parser.add_argument("--appends", type=int, default=300)
    parser.add_argument("--big", type=int, default=100_000)
    args = parser.parse_args()

    results: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    backends = {"memory": _memory, "sqlite": _sqlite, "postgres": _postgres, "redis": _redis}
    for name, opener in backends.items():
        started = time.perf_counter()
        try:
            async with opener() as store:
                results[name] = await bench(store, loads=args.loads, appends=args.appends,
                                            big=args.big)
        except (ImportError, OSError, TimeoutError) as exc:
            skipped[name] = f"server or driver absent: {type(exc).__name__}: {exc}"
            print(f"{name:8s} skipped ({skipped[name]})")
            continue
        except Exception as exc:  # a driver's own "cannot connect" error
            if "connect" not in str(exc).lower():
                raise
            skipped[name] = f"server absent: {exc}"
            print(f"{name:8s} skipped ({skipped[name]})")
            continue
        r = results[name]
        print(
            f"{name:8s} append {r['append_median_ms']:.3f} ms | load@100 "
            f"{r['load_median_ms_100']:.3f} ms | load@{args.big} "
            f"{r[f'load_median_ms_{args.big}']:.3f} ms | ratio "
            f"{r[f'load_ratio_{args.big}_vs_100']:.2f} | {time.perf_counter() - started:.1f} s total"
        )
    ratio_key = f"load_ratio_{args.big}_vs_100"
    summary = {
        "benchmark": "store",
        "big_turns": args.big,
        "backends": results,
        ratio_key: {name: r[ratio_key] for name, r in results.items()},
        "goal_ratio_max": 2.0,
        "skipped": skipped,
    }
    print(json.dumps(summary, ensure_ascii=False))


if __name__ == "__main__":
    asyncio.run(main())
