"""A fresh, isolated store URL per backend for tests: SQLite file, PostgreSQL schema, Redis namespace.

``async with fresh_store_url("postgres", tmp_path) as url`` gives a URL whose
data nobody else sees and which is dropped afterwards; an unreachable service
is skipped (or fails under ``CI=true``, see `skip_or_fail`).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal

from .contract import service_url, skip_or_fail

__all__ = ["PG_DSN", "REDIS_URL", "Backend", "fresh_store_url"]

Backend = Literal["sqlite", "postgres", "redis"]
PG_DSN = service_url("CONTEXTMODE_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = service_url("CONTEXTMODE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@asynccontextmanager
async def _postgres() -> AsyncIterator[str]:
    try:
        import asyncpg
    except ImportError:
        skip_or_fail("asyncpg is not installed (extra 'postgres')")
    try:
        conn = await asyncpg.connect(PG_DSN, timeout=3)
    except (TimeoutError, OSError, asyncpg.PostgresError) as exc:
        skip_or_fail(f"PostgreSQL is not reachable at {PG_DSN}: {exc}")
    schema = f"cm_test_{uuid.uuid4().hex[:12]}"
    sep = "&" if "?" in PG_DSN else "?"
    try:
        yield f"{PG_DSN}{sep}schema={schema}"
    finally:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conn.close()


@asynccontextmanager
async def _redis() -> AsyncIterator[str]:
    try:
        import redis.asyncio as aioredis
        from redis.exceptions import RedisError
    except ImportError:
        skip_or_fail("redis is not installed (extra 'redis')")
    client = aioredis.Redis.from_url(REDIS_URL, socket_connect_timeout=3)
    try:
        await client.ping()
    except (OSError, RedisError) as exc:
        await client.aclose()
        skip_or_fail(f"Redis is not reachable at {REDIS_URL}: {exc}")
    namespace = f"cmtest:{uuid.uuid4().hex[:12]}:"
    sep = "&" if "?" in REDIS_URL else "?"
    try:
        yield f"{REDIS_URL}{sep}namespace={namespace}"
    finally:
        keys = [key async for key in client.scan_iter(match=f"{namespace}*", count=1000)]
        if keys:
            await client.delete(*keys)
        await client.aclose()


@asynccontextmanager
async def fresh_store_url(backend: Backend, folder: Path) -> AsyncIterator[str]:
    """A store URL of ``backend`` holding nothing yet (``folder`` holds the SQLite file)."""
    if backend == "sqlite":
        yield f"sqlite:///{(folder / f'store-{uuid.uuid4().hex[:8]}.db').absolute()}"
    elif backend == "postgres":
        async with _postgres() as url:
            yield url
    else:
        async with _redis() as url:
            yield url
