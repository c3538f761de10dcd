"""PostgreSQL store: the contract and 8 concurrent writers (needs the test server)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from contextmode.testing.contract import (
    StoreContract,
    check_concurrent_writers,
    service_url,
    skip_or_fail,
)

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

    await check_concurrent_writers([PostgresStore(DSN, schema=schema, min_size=1, max_size=1) for _ in range(8)])
