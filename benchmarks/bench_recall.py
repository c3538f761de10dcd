"""Recall speed: selecting recall turns at 1,000 / 10,000 / 100,000 stored turns, and indexing one turn.

Turns are synthetic chat lines whose words follow a Zipf law over a 20,000-word
vocabulary (common words occur in a large share of turns, as in real chat),
mixed with Chinese lines; queries are 4–10 words drawn the same way. Timed:

- ``select``: `Recaller.recall` on a warm session: BM25 search, pseudo-relevance
  feedback search, neighbour expansion and reading the chosen turns from the
  in-memory store (what the engine does per message);
- ``index``: `BM25Index.add` of one new turn into the 100,000-turn index.

Goals (issue 6): select < 20 ms at 100,000 turns, index < 1 ms a turn.
Last line: a JSON object with the medians.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from datetime import UTC, datetime, timedelta

from contextmode.memory.recall import Recaller
from contextmode.memory.recall_index import BM25Index
from contextmode.store.memory import MemoryStore
from contextmode.types import NewTurn, Turn

SIZES = (1_000, 10_000, 100_000)
QUERIES = 60
_ZH = ["我妹妹下个月结婚", "明天去医院复查", "周末想去爬山", "这个按钮在哪里", "预算五十元以内", "不要辣的菜"]


def _vocabulary(rng: random.Random, size: int = 20_000) -> tuple[list[str], list[float]]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(3, 9))) for _ in range(size)]
    weights = [1.0 / (rank + 1) ** 1.07 for rank in range(size)]
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
        await store.append("bench", "s", [
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
        state = await store.load("bench", "s", recent=8)
        started = time.perf_counter()
        index = await recaller.index(store, "bench", "s", last_seq=state.last_seq)
        build_s[str(n)] = round(time.perf_counter() - started, 3)
        queries = [" ".join(rng.choices(words, weights, k=rng.randint(4, 10))) for _ in range(QUERIES)]
        queries[::5] = [rng.choice(_ZH) for _ in queries[::5]]
        timings = []
        for query in queries:
            started = time.perf_counter()
            await recaller.recall(store, state, query, limit=128)
            timings.append((time.perf_counter() - started) * 1000)
        select_ms[str(n)] = round(statistics.median(timings), 3)
        print(f"{n:>7} turns: index built in {build_s[str(n)]:.2f} s, "
              f"select median {select_ms[str(n)]:.2f} ms (p90 {sorted(timings)[int(0.9 * len(timings))]:.2f} ms)")
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


def main() -> None:
    result = asyncio.run(_bench())
    print(json.dumps(result))


if __name__ == "__main__":
    main()
