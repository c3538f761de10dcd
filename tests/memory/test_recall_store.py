"""The recall index kept in the store: same ranking as in memory on every backend
(SQLite, PostgreSQL, Redis), migration of sessions written before it, several workers."""

from __future__ import annotations

import json
import random
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from contextmode.memory.recall import Recaller, RecallSettings
from contextmode.memory.recall.recaller import query_reads
from contextmode.store.base import Store
from contextmode.store.factory import open_store
from contextmode.store.memory import MemoryStore
from contextmode.store.postings import (
    LAYOUT,
    POSTING,
    PostingsStore,
    catch_up,
    postings_for,
    unpack,
)
from contextmode.store.sqlite import schema as _sqlite_schema
from contextmode.testing.backends import PG_DSN, Backend, fresh_store_url
from contextmode.types import NewTurn, Role, SessionKey, Turn

_WORDS = ["coffee", "weather", "garden", "running", "music", "movie", "dinner", "travel", "office",
          "project", "meeting", "weekend", "book", "pizza", "train", "river", "beach", "guitar",
          "我妹妹下个月结婚", "明天去医院复查", "周末想去爬山"]
_QUERIES = ["coffee and pizza", "where is the river beach", "Ann guitar movie", "妹妹结婚", "music",
            # semantic expansion: "song" also asks for "music", "meal" for "dinner"
            "a song before the meal"]
BACKENDS = [
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("redis", marks=pytest.mark.redis),
]


def _turns(n: int, seed: int = 3) -> list[NewTurn]:
    """A conversation with now and then an engine notice (never indexed, nor its words
    lent to the next turn) and a system turn."""
    rng = random.Random(seed)
    turns = []
    for i in range(n):
        role: Role = "user" if i % 2 == 0 else "assistant"
        metadata: dict[str, object] = {"speaker": "Ann" if i % 2 == 0 else "Bob"}
        if i % 2 and rng.random() < 0.05:
            metadata = {"notice": True}
        elif rng.random() < 0.01:
            role, metadata = "system", {}
        turns.append(NewTurn(role=role, tokens=5, metadata=metadata,
                             content=" ".join(rng.choice(_WORDS) for _ in range(rng.randint(2, 10)))))
    return turns


@asynccontextmanager
async def _store(backend: Backend, folder: Path) -> AsyncIterator[Store]:
    async with fresh_store_url(backend, folder) as url:
        store = open_store(url)
        try:
            yield store
        finally:
            await store.close()


async def _hits(store: Store, query: str, recaller: Recaller | None = None) -> list[tuple[int, object]]:
    """Recalled seqs with their scores (equal scores: the same BM25 arithmetic)."""
    state = await store.load(SessionKey("t", "s"))
    recalled = await (recaller or Recaller()).recall(store, state, query, limit=40)
    return [(t.seq, t.metadata["recall"]["score"]) for t in recalled]


async def _reference(turns: list[NewTurn]) -> dict[str, list[tuple[int, object]]]:
    memory = MemoryStore()
    for turn in turns:
        await memory.append(SessionKey("t", "s"), [turn])
    return {q: await _hits(memory, q) for q in _QUERIES}


@pytest.mark.parametrize("backend", BACKENDS)
async def test_an_english_recall_reads_the_index_once(backend: Backend, tmp_path: Path) -> None:
    """The message's terms, its neighbours by meaning (frequencies, and the postings of those
    the cost guard keeps) come in one store read; the feedback pass adds its own two."""
    turns = _turns(1200)
    query = "a song before the meal"
    always, near = query_reads(query, [], RecallSettings())
    assert always and near  # an English message with neighbours, some in too many turns
    async with _store(backend, tmp_path) as store:
        for start in range(0, len(turns), 50):
            await store.append(SessionKey("t", "s"), turns[start : start + 50])
        reads: list[str] = []
        for name in ("postings", "term_counts", "query_postings"):
            method = getattr(store, name)

            def counted(*args: object, _name: str = name, _method: Any = method, **kwargs: object) -> Any:
                reads.append(_name)
                return _method(*args, **kwargs)

            setattr(store, name, counted)
        expected = await _reference(turns)
        for feedback, count in ((0, 1), (RecallSettings().feedback_turns, 3)):
            recaller = Recaller(RecallSettings(feedback_turns=feedback))
            for _ in range(2):  # cold, then with the sealed blocks cached
                reads.clear()
                hits = await _hits(store, query, recaller)
                assert len(reads) == count, reads
            if feedback:
                assert hits == expected[query]


@pytest.mark.parametrize("backend", BACKENDS)
async def test_every_store_recalls_exactly_like_the_in_memory_index(backend: Backend, tmp_path: Path) -> None:
    turns = _turns(1200)
    async with _store(backend, tmp_path) as store:
        for start in range(0, len(turns), 7):  # batches of several turns cross block edges too
            await store.append(SessionKey("t", "s"), turns[start : start + 7])
        assert isinstance(store, PostingsStore)
        stats = await store.index_stats(SessionKey("t", "s"))
        indexed = sum(1 for t in turns if t.role != "system" and not t.metadata.get("notice"))
        assert stats.exists and stats.indexed_seq == 1200 and stats.docs == indexed
        recaller = Recaller()
        expected = await _reference(turns)
        for query in _QUERIES:
            assert await _hits(store, query, recaller) == expected[query]
        assert not recaller._entries  # answered from the store: no in-process index was built
        assert await store.delete(SessionKey("t", "s"))
        assert not (await store.index_stats(SessionKey("t", "s"))).exists


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
        [(i, t.role, t.content, json.dumps(dict(t.metadata))) for i, t in enumerate(turns, 1)],
    )
    db.execute("COMMIT")
    db.close()


async def _drop_index(backend: Backend, url: str) -> None:
    """Remove what the index added, leaving the session as written before it existed."""
    if backend == "postgres":
        import asyncpg

        schema = url.partition("schema=")[2]
        conn = await asyncpg.connect(PG_DSN)
        try:
            await conn.execute(";".join(
                f'DELETE FROM "{schema}".{table}'
                for table in ("recall_postings", "recall_recent", "recall_df", "recall_index")
            ))
        finally:
            await conn.close()
    else:
        import redis.asyncio as aioredis

        base, _, namespace = url.partition("?namespace=")
        client = aioredis.Redis.from_url(base)
        try:
            assert await client.delete(f"{namespace}rp:t/s", f"{namespace}ri:t/s") == 2
        finally:
            await client.aclose()


@asynccontextmanager
async def _old_store(backend: Backend, folder: Path, turns: list[NewTurn]) -> AsyncIterator[Store]:
    """A store holding session t/s with ``turns``, written before the recall index existed."""
    async with fresh_store_url(backend, folder) as url:
        if backend == "sqlite":
            _old_database(Path(url.removeprefix("sqlite:///")), turns)
        store = open_store(url)
        try:
            if backend != "sqlite":
                for start in range(0, len(turns), 50):
                    await store.append(SessionKey("t", "s"), turns[start : start + 50])
                await _drop_index(backend, url)
            yield store
        finally:
            await store.close()


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_store_written_before_the_index_migrates_resumably(backend: Backend, tmp_path: Path) -> None:
    turns = _turns(700)
    async with _old_store(backend, tmp_path, turns[:650]) as store:
        assert isinstance(store, PostingsStore)
        # Not migrated yet: appends leave the index alone, recall uses the in-process index.
        await store.append(SessionKey("t", "s"), turns[650:660])
        assert not (await store.index_stats(SessionKey("t", "s"))).exists
        expected = await _reference(turns[:660])
        for query in _QUERIES:
            assert await _hits(store, query) == expected[query]
        # An interrupted migration: one batch committed, then the process stopped.
        assert await store.index_backfill(SessionKey("t", "s"), batch=256) == 256
        assert (await store.index_stats(SessionKey("t", "s"))).indexed_seq == 256
        await store.append(SessionKey("t", "s"), turns[660:680])  # the log moves on meanwhile
        seen: list[tuple[int, int]] = []
        assert await catch_up(store, batch=100, on_progress=lambda d, t: seen.append((d, t))) == 680 - 256
        assert seen[-1] == (424, 424)
        assert await catch_up(store) == 0  # resumed to the end: nothing left
        await store.append(SessionKey("t", "s"), turns[680:])  # written with the turn from now on
        stats = await store.index_stats(SessionKey("t", "s"))
        indexed = sum(1 for t in turns if t.role != "system" and not t.metadata.get("notice"))
        assert stats.indexed_seq == 700 and stats.docs == indexed
        expected = await _reference(turns)
        recaller = Recaller()
        for query in _QUERIES:
            assert await _hits(store, query, recaller) == expected[query]
        assert not recaller._entries


@pytest.mark.parametrize("backend", BACKENDS[1:])
async def test_two_workers_answer_the_same_recall(backend: Backend, tmp_path: Path) -> None:
    turns = _turns(900, seed=5)
    async with fresh_store_url(backend, tmp_path) as url:
        writer, reader = open_store(url), open_store(url)
        try:
            assert isinstance(writer, PostingsStore) and isinstance(reader, PostingsStore)
            for start in range(0, 600, 50):
                await writer.append(SessionKey("t", "s"), turns[start : start + 50])
            first = {q: await _hits(writer, q) for q in _QUERIES}
            # The second worker never saw an append: it reads the same postings.
            assert {q: await _hits(reader, q) for q in _QUERIES} == first
            assert first == await _reference(turns[:600])
            # The first worker writes more; the second (with its cache of sealed blocks) follows.
            cached = Recaller()
            await _hits(reader, "coffee", cached)
            for start in range(600, 900, 50):
                await writer.append(SessionKey("t", "s"), turns[start : start + 50])
            later = await _hits(reader, "coffee and pizza", cached)
            assert later == await _hits(writer, "coffee and pizza")
            assert later == (await _reference(turns))["coffee and pizza"]
        finally:
            await writer.close()
            await reader.close()


def _layout1_rows(turns: list[NewTurn]) -> list[tuple[str, int, bytes]]:
    """The postings rows the index wrote before layout 2: one row per term and block of
    512 seqs, the open block's too (as appends grew it)."""
    log = [Turn(seq=i, role=t.role, content=t.content, tokens=t.tokens, metadata=t.metadata,
                created_at=datetime(2026, 1, 1, tzinfo=UTC)) for i, t in enumerate(turns, 1)]
    return list(postings_for(log, None).rows)


def _layout1_sqlite(path: Path, sessions: dict[str, list[NewTurn]]) -> None:
    """A file as the store wrote it before layout 2: every migration but the last, the
    postings of each session in 512-seq rows and no frequency rows."""
    names = [m.__name__ for m in _sqlite_schema.MIGRATIONS]
    layout2 = names.index("m008_recall_frequencies")
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("BEGIN")
    db.execute("CREATE TABLE _migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)")
    for migration in _sqlite_schema.MIGRATIONS[:layout2]:
        migration(db)
        db.execute("INSERT INTO _migrations VALUES (?, datetime('now'))", (migration.__name__,))
    for sid, turns in sessions.items():
        db.execute("INSERT INTO sessions (tenant, session_id, last_seq, created_at, updated_at)"
                   " VALUES ('t', ?, ?, 1, 1)", (sid, len(turns)))
        db.executemany(
            "INSERT INTO turns (tenant, session_id, seq, role, content, tokens, created_at, metadata)"
            " VALUES ('t', ?, ?, ?, ?, 5, 1, ?)",
            [(sid, i, t.role, t.content, json.dumps(dict(t.metadata))) for i, t in enumerate(turns, 1)],
        )
        added = postings_for([Turn(seq=i, role=t.role, content=t.content, tokens=5, metadata=t.metadata,
                                   created_at=datetime(2026, 1, 1, tzinfo=UTC))
                              for i, t in enumerate(turns, 1)], None)
        db.executemany("INSERT INTO recall_postings VALUES ('t', ?, ?, ?, ?)",
                       [(sid, term, block, data) for term, block, data in added.rows])
        db.execute("INSERT INTO recall_index VALUES ('t', ?, ?, ?, ?)",
                   (sid, len(turns), added.docs, added.length))
    db.execute("COMMIT")
    db.close()


async def _layout1_postgres(url: str, store: Store, sessions: dict[str, list[NewTurn]]) -> None:
    """The same on PostgreSQL: the sessions appended, then their index rewritten as before."""
    import asyncpg

    for sid, turns in sessions.items():
        for start in range(0, len(turns), 50):
            await store.append(SessionKey("t", sid), turns[start : start + 50])
    schema = url.partition("schema=")[2]
    conn = await asyncpg.connect(PG_DSN)
    try:
        await conn.execute(f'SET search_path TO "{schema}"')
        await conn.execute("DELETE FROM recall_postings; DELETE FROM recall_recent; DELETE FROM recall_df;"
                           " UPDATE recall_index SET layout = 1")
        for sid, turns in sessions.items():
            rows = _layout1_rows(turns)
            await conn.executemany("INSERT INTO recall_postings VALUES ('t', $1, $2, $3, $4)",
                                   [(sid, term, block, data) for term, block, data in rows])
    finally:
        await conn.close()


async def _hits_of(store: Store, sid: str, query: str, recaller: Recaller) -> list[tuple[int, object]]:
    state = await store.load(SessionKey("t", sid))
    recalled = await recaller.recall(store, state, query, limit=40)
    return [(t.seq, t.metadata["recall"]["score"]) for t in recalled]


@pytest.mark.parametrize("backend", BACKENDS[:2])
async def test_an_index_of_the_previous_layout_migrates_resumably(backend: Backend, tmp_path: Path) -> None:
    """A database whose index was written before frequency rows and small open-block rows:
    it answers as before, keeps indexing appends, and `catch_up` converts it session by
    session (each in one transaction: an interruption loses nothing)."""
    turns = {"a": _turns(1100, seed=7), "b": _turns(700, seed=8)}
    old = {sid: t[:500] for sid, t in turns.items()}  # each one's open block part-filled
    async with fresh_store_url(backend, tmp_path) as url:
        if backend == "sqlite":
            _layout1_sqlite(Path(url.removeprefix("sqlite:///")), old)
        store = open_store(url)
        try:
            if backend == "postgres":
                await _layout1_postgres(url, store, old)
            assert isinstance(store, PostingsStore)
            assert (await store.index_stats(SessionKey("t", "a"))).layout == 1
            recaller = Recaller()
            reference = await _reference(old["a"])
            for query in _QUERIES:  # layout 1 counts its postings
                assert await _hits_of(store, "a", query, recaller) == reference[query]
            # Appends go on indexing (the open block sealed over its old row, a second one begun).
            for sid in turns:
                for start in range(500, len(turns[sid]), 9):
                    await store.append(SessionKey("t", sid), turns[sid][start : start + 9])
            assert not recaller._entries
            # Interrupted: session a converted, then the process stopped.
            assert await store.index_backfill(SessionKey("t", "a")) == 1100
            assert (await store.index_stats(SessionKey("t", "a"))).layout == LAYOUT
            assert await store.sessions_to_index() == [("t", "b", 0, 700)]
            seen: list[tuple[int, int]] = []
            assert await catch_up(store, on_progress=lambda d, t: seen.append((d, t))) == 700
            assert seen[-1] == (700, 700)
            assert await store.sessions_to_index() == [] and await catch_up(store) == 0
            for sid in turns:
                stats = await store.index_stats(SessionKey("t", sid))
                assert (stats.layout, stats.indexed_seq) == (LAYOUT, len(turns[sid]))
                rows = _layout1_rows(turns[sid])
                frequency: dict[str, int] = {}
                for term, _, data in rows:
                    frequency[term] = frequency.get(term, 0) + len(data) // POSTING.itemsize
                assert await store.term_counts(SessionKey("t", sid), sorted(frequency)) == frequency
                stored = await store.postings(SessionKey("t", sid), sorted(frequency))
                assert {t: unpack(r).tolist() for t, r in stored.items()} == {
                    t: unpack(sorted((b, d) for term, b, d in rows if term == t)).tolist() for t in frequency
                }
                expected = await _reference(turns[sid])
                for query in _QUERIES:
                    assert await _hits_of(store, sid, query, Recaller()) == expected[query]
                    assert await _hits_of(store, sid, query, recaller) == expected[query]
            assert not recaller._entries
        finally:
            await store.close()


async def test_a_term_without_rows_is_kept_without_array_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A query term no turn holds (or one whose sealed blocks are cached and whose open block
    is empty) is kept as it is: no rows unpacked, and the same ranking as in memory."""
    import contextmode.memory.recall.stored as stored

    empty = 0
    real = stored.unpack

    def counting(rows: Any) -> Any:
        nonlocal empty
        empty += not rows
        return real(rows)

    monkeypatch.setattr(stored, "unpack", counting)
    turns = _turns(300)
    query = "coffee zebra xylophone"  # two of its words are in no turn
    async with _store("sqlite", tmp_path) as store:
        for start in range(0, len(turns), 50):
            await store.append(SessionKey("t", "s"), turns[start : start + 50])
        recaller = Recaller()
        first = await _hits(store, query, recaller)
        again = await _hits(store, query, recaller)  # sealed blocks cached: open blocks only
    memory = MemoryStore()
    for turn in turns:
        await memory.append(SessionKey("t", "s"), [turn])
    assert first == again == await _hits(memory, query)
    assert empty == 0
