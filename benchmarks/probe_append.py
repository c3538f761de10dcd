"""Where an indexed append's extra time goes: `bench_recall.py`'s with/without-index
alternation on a smaller session, with timers around the store's own steps.

    PYTHONPATH=src python benchmarks/probe_append.py postgres 20000 300

Prints, per phase, the p50 with the index, without it, and the difference (ms): ``wall``
(the append), ``cpu`` (process CPU), ``analyze`` (the text analysis, done either way),
and PostgreSQL's ``statement`` (the append statement's round trip) or Redis's
``index_rows`` (computing the postings) and ``script`` (the APPEND call). Used for the
"Cheaper indexed appends" figures in docs/benchmarks.md.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import random
import statistics
import sys
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import bench_recall as br

from contextmode.types import NewTurn, SessionKey

_SPENT: dict[str, list[float]] = defaultdict(list)


def _timed(owner: object, name: str, label: str) -> None:
    """Replace ``owner.name`` by a wrapper adding its duration to ``_SPENT[label]``."""
    fn = getattr(owner, name)

    if inspect.iscoroutinefunction(fn):
        async def wrapper(*args: object, **kwargs: object) -> object:
            started = time.perf_counter()
            try:
                return await fn(*args, **kwargs)
            finally:
                _SPENT[label].append(time.perf_counter() - started)
    else:
        def wrapper(*args: object, **kwargs: object) -> object:  # type: ignore[misc]
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                _SPENT[label].append(time.perf_counter() - started)
    setattr(owner, name, wrapper)


def _instrument(backend: str, store: object) -> None:
    from contextmode.store import postings

    _timed(postings, "analyze_texts", "analyze")  # the store front's append prologue (`append_input`)
    if backend == "postgres":
        from contextmode.store.postgres import driver as postgres

        _timed(postgres, "_write_turns", "statement")
    elif backend == "redis":
        from contextmode.store.redis import driver as redis

        _timed(redis, "index_rows", "index_rows")
        _timed(store, "_script", "script")


async def _probe(backend: str, n: int, pairs: int) -> None:
    rng = random.Random(16)
    words, weights = br._vocabulary(rng)
    store, _, cleanup = await br._stored_store(backend)
    try:
        t0 = datetime(2024, 1, 1, tzinfo=UTC)
        for start in range(0, n, 2_000):
            await store.append(SessionKey("bench", "s"), [
                NewTurn(role="user" if (start + i) % 2 == 0 else "assistant",
                        content=br._line(rng, words, weights), tokens=20,
                        created_at=t0 + timedelta(minutes=start + i))
                for i in range(min(2_000, n - start))
            ])
        switch = br._index_switch(backend)
        indexing = [getattr(owner, name) for owner, name, _ in switch]
        if backend == "redis":  # as in bench_recall: "s2" is a session whose index lags
            await store.append(SessionKey("bench", "s2"), [NewTurn(role="user", content="first", tokens=1)])
            async with store.driver._guard() as client:  # type: ignore[attr-defined]
                await client.hset(store.driver._keys("bench", "s2")["rindex"], "indexed_seq", -1)  # type: ignore[attr-defined]
        _instrument(backend, store)
        phases: dict[bool, dict[str, list[float]]] = {True: defaultdict(list), False: defaultdict(list)}
        for i in range(2 * pairs):
            turn = NewTurn(role="user", content=br._line(rng, words, weights), tokens=20)
            use = i % 2 == 0
            for (owner, name, off), on in zip(switch, indexing, strict=True):
                setattr(owner, name, on if use else off)
            _SPENT.clear()
            cpu, started = time.process_time(), time.perf_counter()
            await store.append(SessionKey("bench", "s" if use else "s2"), [turn])
            phases[use]["wall"].append(time.perf_counter() - started)
            phases[use]["cpu"].append(time.process_time() - cpu)
            for label, spent in _SPENT.items():
                phases[use][label].append(sum(spent))
        for (owner, name, _), on in zip(switch, indexing, strict=True):
            setattr(owner, name, on)
        print(f"{backend}: {n} turns, {pairs} pairs, load average {os.getloadavg()[0]:.2f}")
        for label, with_index in phases[True].items():
            a = statistics.median(with_index) * 1000
            b = statistics.median(phases[False][label]) * 1000 if phases[False][label] else float("nan")
            print(f"  {label:11s} with {a:7.3f}  without {b:7.3f}  extra {a - b:7.3f} ms")
    finally:
        await store.close()
        await cleanup()


if __name__ == "__main__":
    given = sys.argv[1:]
    asyncio.run(_probe(
        given[0] if given else "postgres",
        int(given[1]) if len(given) > 1 else 20_000,
        int(given[2]) if len(given) > 2 else 300,
    ))
