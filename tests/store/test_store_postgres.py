"""PostgreSQL store: the contract and 8 concurrent writers (needs the test server)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from contextmode.testing.contract import (
    StoreContract,
    check_appends_after_another_worker_index_right,
    check_concurrent_writers,
    service_url,
    skip_or_fail,
)
from contextmode.types import SessionKey

pytestmark = pytest.mark.postgres

DSN = service_url("CONTEXTMODE_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")


async def _fresh_schema() -> str:
    try:
        import asyncpg
    except ImportError:
        skip_or_fail("asyncpg is not installed (extra 'postgres')")
    try:
        conn = await asyncpg.connect(DSN, timeout=3)
    except (TimeoutError, OSError, asyncpg.PostgresError) as exc:
        skip_or_fail(f"PostgreSQL is not reachable at {DSN}: {exc}")
    await conn.close()
    return f"cm_test_{uuid.uuid4().hex[:12]}"


async def _drop_schema(schema: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(DSN)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


@pytest.fixture
async def schema() -> AsyncIterator[str]:
    name = await _fresh_schema()
    yield name
    await _drop_schema(name)


class TestPostgresStore(StoreContract):
    @pytest.fixture
    async def store(self, schema: str) -> AsyncIterator[object]:
        from contextmode.store.postgres import PostgresStore

        store = PostgresStore(DSN, schema=schema, max_size=4)
        yield store
        await store.close()


async def test_a_worker_appending_after_another_or_after_a_recreation_indexes_right(schema: str) -> None:
    """Each append writes its postings in its own statement, computed for the head its
    process's last append of the session left; a stale head is caught and redone."""
    from contextmode.store.postgres import PostgresStore

    async with PostgresStore(DSN, schema=schema) as one, PostgresStore(DSN, schema=schema) as two:
        await check_appends_after_another_worker_index_right(one, two)


async def test_eight_connections_append_200_turns_each(schema: str) -> None:
    from contextmode.store.postgres import PostgresStore

    await check_concurrent_writers([PostgresStore(DSN, schema=schema, min_size=1, max_size=1) for _ in range(8)])


# The three statements `put_trace` ran in one transaction before it became one statement.
_W = "WHERE tenant = $1 AND session_id = $2"
_THREE_STATEMENTS = (
    "INSERT INTO turn_traces (tenant, session_id, turn, created_at, body)"
    " SELECT $1, $2, $3, $4, $5 FROM sessions WHERE tenant = $1 AND session_id = $2"
    " ON CONFLICT (tenant, session_id, turn)"
    " DO UPDATE SET created_at = excluded.created_at, body = excluded.body",
    f"DELETE FROM turn_traces {_W} AND turn <= (SELECT MAX(turn) FROM turn_traces {_W}) - $3",
    f"DELETE FROM turn_traces {_W} AND created_at < $3 AND turn IN"
    f" (SELECT turn FROM turn_traces {_W} ORDER BY turn LIMIT 8)",
)


def _typed(body: str | None, packed: bytes | None) -> str:
    """What a kept row holds, whichever way it was written: the trace's typed message (a
    packed trace, or the JSON the three statements wrote) or the test's own body."""
    import json

    from contextmode.store.trace_pack import unpack_text

    if packed is not None:
        return str(json.loads(unpack_text(packed))["typed"])
    assert body is not None
    return str(json.loads(body)["typed"]) if body.startswith("{") else body


async def test_put_trace_in_one_statement_keeps_what_the_three_statements_kept(schema: str) -> None:
    """From random kept traces, a random write (a new, rewritten or old turn; count and age
    limits; an unknown session) leaves the same traces as the three statements did."""
    import random
    from datetime import UTC, datetime, timedelta

    from contextmode.store.postgres import PostgresStore
    from contextmode.store.records import TurnTrace, trace_to_json
    from contextmode.testing.contract import new_turns

    store = PostgresStore(DSN, schema=schema, max_size=2)
    rng = random.Random(7)
    base = datetime(2026, 1, 1, tzinfo=UTC)
    try:
        for session in ("one", "new", "old"):
            await store.append(SessionKey("t", session), new_turns(2))
        async with store.driver._db() as db:
            for step in range(200):
                rows = [(turn, base + timedelta(hours=rng.randint(0, 30)), f"{turn}")
                        for turn in rng.sample(range(1, 21), rng.randint(0, 14))]
                for session in ("new", "old"):
                    await db.execute("DELETE FROM turn_traces WHERE session_id = $1", session)
                    await db.executemany(
                        "INSERT INTO turn_traces (tenant, session_id, turn, created_at, body)"
                        " VALUES ('t', $1, $2, $3, $4)", [(session, *row) for row in rows])
                turn = rng.randint(1, 22)
                trace = TurnTrace(turn=turn, user_seq=1, answer_seq=2, typed=f"s{step}", sent=f"s{step}",
                                  messages=(), created_at=base + timedelta(hours=rng.randint(0, 30)))
                keep = rng.choice((0, 0, 1, 3, 5, 9, 12))
                older = rng.choice((None, base + timedelta(hours=rng.randint(0, 30))))
                ghost = rng.random() < 0.1  # no session: nothing is written, the limits still apply
                await store.put_trace(SessionKey("t", "ghost" if ghost else "new"), trace, keep=keep, older_than=older)
                key = ("t", "ghost" if ghost else "old")
                async with db.transaction():
                    await db.execute(_THREE_STATEMENTS[0], *key, turn, trace.created_at, trace_to_json(trace))
                    if keep:
                        await db.execute(_THREE_STATEMENTS[1], *key, keep)
                    if older is not None:
                        await db.execute(_THREE_STATEMENTS[2], *key, older)
                kept = {}
                for copy in ("new", "old"):
                    kept[copy] = [(r["turn"], r["created_at"], _typed(r["body"], r["packed"])) for r in await db.fetch(
                        "SELECT turn, created_at, body, packed FROM turn_traces WHERE tenant = 't'"
                        " AND session_id = $1 ORDER BY turn", copy)]
                assert kept["new"] == kept["old"], f"step {step}: turn {turn} keep {keep} older {older}"
    finally:
        await store.close()


async def test_job_outcomes_in_one_write_count_as_one_at_a_time(schema: str) -> None:
    from datetime import UTC, datetime, timedelta

    from contextmode.store.base import JobOutcome
    from contextmode.store.postgres import PostgresStore
    from contextmode.testing.contract import new_turns

    store = PostgresStore(DSN, schema=schema, max_size=2)
    at = datetime(2026, 5, 1, tzinfo=UTC)
    outcomes = [
        JobOutcome(job="emotion", ok=True, finished_at=at),
        JobOutcome(job="constraints", ok=False, error="empty quote", rejected=True, finished_at=at),
        JobOutcome(job="summary", ok=False, error="timeout", finished_at=at + timedelta(seconds=1)),
        JobOutcome(job="constraints", ok=False, error="bad json", finished_at=at + timedelta(seconds=2)),
        JobOutcome(job="summary", ok=True, finished_at=at + timedelta(seconds=3)),
    ]
    try:
        await store.append(SessionKey("t", "batch"), new_turns(2))
        await store.record_jobs(SessionKey("t", "batch"), outcomes[:1])
        await store.record_jobs(SessionKey("t", "batch"), outcomes)
        await store.record_jobs(SessionKey("t", "nobody"), outcomes)  # unknown session: ignored
        info = await store.info(SessionKey("t", "batch"))
        assert info is not None
        stats = {name: (s.ok, s.failed, s.rejected, s.last_error, s.last_run) for name, s in info.jobs.items()}
        assert stats == {
            "emotion": (2, 0, 0, None, at),
            "constraints": (0, 1, 1, "bad json", at + timedelta(seconds=2)),
            "summary": (1, 1, 0, None, at + timedelta(seconds=3)),
        }
        assert await store.info(SessionKey("t", "nobody")) is None
        # With a held job lock: released in the same write; leaving its context writes nothing.
        async with store.lock(SessionKey("t", "batch")) as held:
            await store.record_jobs(SessionKey("t", "batch"), [], release=held)
            async with store.lock(SessionKey("t", "batch")) as second:  # free at once
                assert second.token > held.token
        async with store.lock(SessionKey("t", "batch")):
            pass
    finally:
        await store.close()


async def test_a_recall_reads_on_one_pooled_connection(schema: str) -> None:
    """Inside `one_connection` a task's calls share one connection (a recall's statistics,
    postings, counts and turns: one pool acquisition), a task it starts takes its own, and
    the recalled turns are the same as with a connection per read."""
    import asyncio

    from contextmode.memory.recall import Recaller
    from contextmode.store.postgres import PostgresStore
    from contextmode.store.postings import one_connection
    from contextmode.types import NewTurn

    store = PostgresStore(DSN, schema=schema, max_size=3)
    said = ["my sister is called Lucy", "noted", "we went kayaking in June", "nice",
            "the weather is cold", "ok", "I like green tea", "sure", "tell me a joke", "ha"]
    try:
        await store.append(SessionKey("t", "s"), [NewTurn(role="user" if i % 2 == 0 else "assistant", content=text, tokens=5)
                                       for i, text in enumerate(said)])
        state = await store.load(SessionKey("t", "s"))
        recaller = Recaller()
        apart = await recaller.recall(store, state, "what is my sister called?")
        acquired: list[int] = []

        class Counting:  # the pool, counting its acquisitions
            def __init__(self, pool: object) -> None:
                self.pool = pool

            def acquire(self) -> object:
                acquired.append(1)
                return self.pool.acquire()  # type: ignore[attr-defined]

            def __getattr__(self, name: str) -> object:
                return getattr(self.pool, name)

        store.driver._pool = Counting(store.driver._pool)
        together = await recaller.recall(store, state, "what is my sister called?")
        assert [t.seq for t in together] == [t.seq for t in apart] and together[0].content == said[0]
        assert len(acquired) == 1
        acquired.clear()
        async with one_connection(store):
            await store.index_stats(SessionKey("t", "s"))
            await asyncio.create_task(store.version(SessionKey("t", "s")))  # another task: its own connection
            await store.turns_at(SessionKey("t", "s"), [1, 3])
        assert len(acquired) == 2
        acquired.clear()
        await store.index_stats(SessionKey("t", "s"))
        await store.index_stats(SessionKey("t", "s"))
        assert len(acquired) == 2
    finally:
        await store.close()


async def test_a_shared_connection_is_taken_at_the_first_statement_and_let_go_early(schema: str) -> None:
    """`one_connection` takes no connection on entry, one at its first statement for every
    statement after; `let_go` hands it back at once (the next statement takes a fresh one), and
    so does a failed statement; the scope's end hands back what it holds."""
    from contextmode.errors import ConflictError
    from contextmode.store.postgres import PostgresStore
    from contextmode.testing.contract import new_turns

    store = PostgresStore(DSN, schema=schema, max_size=3)
    try:
        await store.append(SessionKey("t", "s"), new_turns(4))
        pool = store.driver._pool
        acquired: list[int] = []

        class Counting:  # the pool, counting its acquisitions
            def acquire(self) -> object:
                acquired.append(1)
                return pool.acquire()

            def __getattr__(self, name: str) -> object:
                return getattr(pool, name)

        def in_use() -> int:
            return int(pool.get_size() - pool.get_idle_size())

        store.driver._pool = Counting()
        async with store.one_connection():
            assert (len(acquired), in_use()) == (0, 0)  # nothing taken on entry
            await store.let_go()  # nothing held: nothing to do
            assert (await store.version(SessionKey("t", "s"))).last_seq == 4
            assert (len(acquired), in_use()) == (1, 1)
            await store.load(SessionKey("t", "s"))
            await store.turns_at(SessionKey("t", "s"), [1, 3])
            async with store.lock(SessionKey("t", "s")):
                assert (len(acquired), in_use()) == (1, 1)
            await store.let_go()
            assert (len(acquired), in_use()) == (1, 0)  # back in the pool before the scope ends
            await store.turns(SessionKey("t", "s"))
            assert (len(acquired), in_use()) == (2, 1)  # a fresh one
            with pytest.raises(ConflictError):
                await store.append(SessionKey("t", "s"), new_turns(1), expected_last_seq=1)
            assert in_use() == 0  # a failed statement's connection went back
            await store.append(SessionKey("t", "s"), new_turns(1, start=5))
            assert (len(acquired), in_use()) == (3, 1)
        assert (len(acquired), in_use()) == (3, 0)
        assert [t.seq for t in await store.turns(SessionKey("t", "s"))] == [1, 2, 3, 4, 5]
    finally:
        await store.close()


async def test_an_append_at_the_known_head_is_one_statement_and_writes_what_the_full_append_writes(
    schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append at the head this process's last append left is one statement (no BEGIN and
    COMMIT); the turns, emotions, head and recall index it leaves (a block sealed on the way,
    a stale head and a failed compare-and-set in between) are the full append's."""
    from dataclasses import replace

    import asyncpg

    from contextmode.errors import ConflictError
    from contextmode.store.postgres import PostgresStore
    from contextmode.store.postgres import driver as postgres
    from contextmode.testing.contract import new_turns

    store = PostgresStore(DSN, schema=schema, max_size=1)
    other = PostgresStore(DSN, schema=schema, max_size=1)  # another worker: leaves `store`'s head stale

    async def run(session: str) -> None:
        await store.append(SessionKey("t", session), new_turns(3))
        for i in range(4, 530):
            turns = new_turns(1, start=i)
            if i == 100:
                await other.append(SessionKey("t", session), turns)
            elif i == 200:
                with pytest.raises(ConflictError):
                    await store.append(SessionKey("t", session), turns, expected_last_seq=1)
                await store.append(SessionKey("t", session), turns, expected_last_seq=199)
            else:
                await store.append(SessionKey("t", session), [replace(t, emotion=0.5) for t in turns] if i % 7 else turns)

    async def rows(session: str) -> list[list[tuple[object, ...]]]:
        conn = await asyncpg.connect(DSN, server_settings={"search_path": schema})
        try:
            out = []
            for table, order in [("turns", "seq"), ("turn_emotions", "seq"), ("recall_recent", "block, term"),
                                 ("recall_postings", "term, block"), ("recall_df", "term"), ("recall_index", "1"),
                                 ("sessions", "1")]:
                found = await conn.fetch(f"SELECT * FROM {table} WHERE session_id = $1 ORDER BY {order}", session)
                drop = {"session_id", "created_at", "updated_at"}
                out.append([tuple(v for k, v in r.items() if k not in drop) for r in found])
            return out
        finally:
            await conn.close()

    try:
        await run("fast")
        queries: list[str] = []
        async with store.driver._db() as db:
            db.add_query_logger(lambda record: queries.append(record.query))
        await store.append(SessionKey("t", "fast"), new_turns(1, start=530))
        assert len(queries) == 1 and "BEGIN" not in queries[0]
        monkeypatch.setattr(postgres, "_at_known_head", lambda index, count: False)  # every append the full one
        await run("full")
        await store.append(SessionKey("t", "full"), new_turns(1, start=530))
        fast, full = await rows("fast"), await rows("full")
        assert [len(r) for r in fast] == [len(r) for r in full] and fast[2] and fast[3]
        assert fast == full
    finally:
        await store.close()
        await other.close()


async def test_index_stats_after_a_load_are_those_a_read_gives(schema: str) -> None:
    """`load` reads the recall index statistics with the state; the same task's next call,
    `index_stats`, answers from them (no statement). Anything run in between, or another
    task, or another session, reads them: never older than what the store holds for them."""
    import asyncio

    from contextmode.store.postgres import PostgresStore
    from contextmode.types import NewTurn

    store = PostgresStore(DSN, schema=schema)
    key, other = SessionKey("t", "s"), SessionKey("t", "o")
    try:
        for k in (key, other):
            await store.append(k, [NewTurn(role="user", content="my sister is called Lucy", tokens=5)])
        statements: list[str] = []
        driver = store.driver
        original = driver._db

        def counting() -> object:
            statements.append("db")
            return original()

        driver._db = counting  # type: ignore[method-assign]
        await store.load(key)
        first = await store.index_stats(key)
        assert len(statements) == 1 and first.exists and first.indexed_seq == 1 and first.docs == 1
        driver._db = original  # type: ignore[method-assign]
        assert first == await store.index_stats(key)  # a read gives the same

        await store.load(key)
        await store.append(key, [NewTurn(role="assistant", content="noted", tokens=2)])
        assert (await store.index_stats(key)).indexed_seq == 2  # the append in between: read again
        await store.load(key)
        assert (await store.index_stats(other)).indexed_seq == 1  # another session: read
        await store.load(key)
        await asyncio.create_task(store.append(key, [NewTurn(role="user", content="and tea", tokens=2)]))
        assert (await store.index_stats(key)).indexed_seq == 3  # another task's statement: read again
        await store.load(key)
        assert (await asyncio.create_task(store.index_stats(key))).indexed_seq == 3  # another task: read
        await store.append(SessionKey("t", "new"), [NewTurn(role="user", content="hi", tokens=1)])
        await store.load(SessionKey("t", "new"))
        assert await store.index_stats(SessionKey("t", "new")) == await store.index_stats(SessionKey("t", "new"))
    finally:
        await store.close()
