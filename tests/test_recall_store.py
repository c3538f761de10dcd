"""The recall index kept in the store: same ranking as in memory, migration, several workers."""

from __future__ import annotations

import json
import random
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from contextmode.memory.recall import Recaller
from contextmode.store import _sqlite_schema
from contextmode.store.memory import MemoryStore
from contextmode.store.postings import catch_up, has_postings
from contextmode.store.sqlite import SQLiteStore
from contextmode.types import NewTurn
from test_store_postgres import DSN, _drop_schema, _fresh_schema

_WORDS = ["coffee", "weather", "garden", "running", "music", "movie", "dinner", "travel", "office",
          "project", "meeting", "weekend", "book", "pizza", "train", "river", "beach", "guitar",
          "我妹妹下个月结婚", "明天去医院复查", "周末想去爬山"]
_QUERIES = ["coffee and pizza", "where is the river beach", "Ann guitar movie", "妹妹结婚", "music"]


def _turns(n: int, seed: int = 3) -> list[NewTurn]:
    rng = random.Random(seed)
    return [
        NewTurn(role="user" if i % 2 == 0 else "assistant", tokens=5,
                content=" ".join(rng.choice(_WORDS) for _ in range(rng.randint(2, 10))),
                metadata={"speaker": "Ann" if i % 2 == 0 else "Bob"})
        for i in range(n)
    ]


async def _ranked(store: object, query: str) -> list[int]:
    state = await store.load("t", "s")  # type: ignore[attr-defined]
    return [t.seq for t in await Recaller().recall(store, state, query, limit=40)]  # type: ignore[arg-type]


async def _reference(turns: list[NewTurn]) -> dict[str, list[int]]:
    memory = MemoryStore()
    for turn in turns:
        await memory.append("t", "s", [turn])
    return {q: await _ranked(memory, q) for q in _QUERIES}


async def test_sqlite_index_ranks_exactly_like_the_in_memory_index(tmp_path: Path) -> None:
    turns = _turns(1200)
    store = SQLiteStore(tmp_path / "a.db")
    for start in range(0, len(turns), 7):  # batches of several turns cross block edges too
        await store.append("t", "s", turns[start : start + 7])
    assert has_postings(store)
    stats = await store.index_stats("t", "s")
    assert stats.exists and stats.indexed_seq == 1200 and stats.docs == 1200
    recaller = Recaller()
    state = await store.load("t", "s")
    expected = await _reference(turns)
    for query in _QUERIES:
        assert [t.seq for t in await recaller.recall(store, state, query, limit=40)] == expected[query]
    assert not recaller._entries  # answered from the store: no in-process index was built
    assert await store.delete("t", "s")
    assert not (await store.index_stats("t", "s")).exists
    await store.close()


def _old_database(path: Path, turns: list[NewTurn]) -> None:
    """A file as the store wrote it before the recall index existed (migrations 1–5 only)."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("BEGIN")
    db.execute("CREATE TABLE _migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)")
    for migration in _sqlite_schema.MIGRATIONS[:5]:
        migration(db)
        db.execute("INSERT INTO _migrations VALUES (?, datetime('now'))", (migration.__name__,))
    db.execute("INSERT INTO sessions (tenant, session_id, last_seq, created_at, updated_at)"
               " VALUES ('t', 's', ?, 1, 1)", (len(turns),))
    db.executemany(
        "INSERT INTO turns (tenant, session_id, seq, role, content, tokens, created_at, metadata)"
        " VALUES ('t', 's', ?, ?, ?, 5, 1, ?)",
        [(i, t.role, t.content, json.dumps({"speaker": t.metadata["speaker"]}))
         for i, t in enumerate(turns, 1)],
    )
    db.execute("COMMIT")
    db.close()


async def test_a_database_written_before_the_index_migrates_resumably(tmp_path: Path) -> None:
    turns = _turns(700)
    path = tmp_path / "old.db"
    _old_database(path, turns[:650])
    store = SQLiteStore(path)
    # Not migrated yet: appends leave the index alone, recall uses the in-process index.
    await store.append("t", "s", turns[650:660])
    assert not (await store.index_stats("t", "s")).exists
    expected = await _reference(turns[:660])
    for query in _QUERIES:
        assert await _ranked(store, query) == expected[query]
    # An interrupted migration: one batch committed, then the process stopped.
    assert await store.index_backfill("t", "s", batch=256) == 256
    assert (await store.index_stats("t", "s")).indexed_seq == 256
    await store.append("t", "s", turns[660:680])  # the log moves on meanwhile
    seen: list[tuple[int, int]] = []
    assert await catch_up(store, batch=100, on_progress=lambda d, t: seen.append((d, t))) == 680 - 256
    assert seen[-1] == (424, 424)
    assert await catch_up(store) == 0  # resumed to the end: nothing left
    await store.append("t", "s", turns[680:])  # written with the turn from now on
    stats = await store.index_stats("t", "s")
    assert stats.indexed_seq == 700 and stats.docs == 700
    expected = await _reference(turns)
    recaller = Recaller()
    state = await store.load("t", "s")
    for query in _QUERIES:
        assert [t.seq for t in await recaller.recall(store, state, query, limit=40)] == expected[query]
    assert not recaller._entries
    await store.close()


@pytest.fixture
async def schema() -> AsyncIterator[str]:
    name = await _fresh_schema()
    yield name
    await _drop_schema(name)


@pytest.mark.postgres
async def test_two_postgres_workers_answer_the_same_recall(schema: str) -> None:
    from contextmode.store.postgres import PostgresStore

    turns = _turns(900, seed=5)
    writer = PostgresStore(DSN, schema=schema, max_size=2)
    reader = PostgresStore(DSN, schema=schema, max_size=2)
    try:
        for start in range(0, 600, 50):
            await writer.append("t", "s", turns[start : start + 50])
        first = {q: await _ranked(writer, q) for q in _QUERIES}
        # The second worker never saw an append: it reads the same postings.
        assert {q: await _ranked(reader, q) for q in _QUERIES} == first
        assert first == await _reference(turns[:600])
        # The first worker writes more; the second (with its cache of sealed blocks) follows.
        cached = Recaller()
        state = await reader.load("t", "s")
        await cached.recall(reader, state, "coffee", limit=40)
        for start in range(600, 900, 50):
            await writer.append("t", "s", turns[start : start + 50])
        state = await reader.load("t", "s")
        later = [t.seq for t in await cached.recall(reader, state, "coffee and pizza", limit=40)]
        assert later == await _ranked(writer, "coffee and pizza")
        assert later == (await _reference(turns))["coffee and pizza"]
    finally:
        await writer.close()
        await reader.close()
