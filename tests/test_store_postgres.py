"""PostgreSQL store: the contract and 8 concurrent writers (needs the test server)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from contextmode.errors import ConflictError
from contextmode.testing.contract import StoreContract, new_turns, service_url, skip_or_fail

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


async def test_eight_connections_append_200_turns_each(schema: str) -> None:
    from contextmode.store.postgres import PostgresStore

    stores = [PostgresStore(DSN, schema=schema, min_size=1, max_size=1) for _ in range(8)]

    async def writer(k: int) -> None:
        store = stores[k]
        for i in range(200):
            turn = new_turns(1, prefix=f"w{k}:{i}")
            if k % 2:  # odd writers use compare-and-set and retry on conflict
                while True:
                    last = (await store.version("t", "shared")).last_seq
                    try:
                        await store.append("t", "shared", turn, expected_last_seq=last)
                        break
                    except ConflictError:
                        continue
            else:
                await store.append("t", "shared", turn)

    try:
        await asyncio.gather(*(writer(k) for k in range(8)))
        turns = await stores[0].turns("t", "shared")
    finally:
        for store in stores:
            await store.close()
    assert [t.seq for t in turns] == list(range(1, 1601))
    by_writer: dict[str, list[int]] = {}
    for turn in turns:
        writer_id, index = turn.content.split()[0].split(":")
        by_writer.setdefault(writer_id, []).append(int(index))
    assert sorted(by_writer) == [f"w{k}" for k in range(8)]
    assert all(indexes == list(range(200)) for indexes in by_writer.values())
