"""Redis store: the contract and 8 concurrent writers (needs the test server)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from contextmode.testing.contract import (
    StoreContract,
    check_concurrent_writers,
    new_turns,
    service_url,
    skip_or_fail,
)

pytestmark = pytest.mark.redis

URL = service_url("CONTEXTMODE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture
async def namespace() -> AsyncIterator[str]:
    try:
        import redis.asyncio as aioredis
        from redis.exceptions import RedisError
    except ImportError:
        skip_or_fail("redis is not installed (extra 'redis')")
    client = aioredis.Redis.from_url(URL, socket_connect_timeout=3)
    try:
        await client.ping()
    except (OSError, RedisError) as exc:
        await client.aclose()
        skip_or_fail(f"Redis is not reachable at {URL}: {exc}")
    name = f"cmtest:{uuid.uuid4().hex[:12]}:"
    yield name
    keys = [key async for key in client.scan_iter(match=f"{name}*", count=1000)]
    if keys:
        await client.delete(*keys)
    await client.aclose()


class TestRedisStore(StoreContract):
    @pytest.fixture
    async def store(self, namespace: str) -> AsyncIterator[object]:
        from contextmode.store.redis import RedisStore

        store = RedisStore(URL, namespace=namespace)
        yield store
        await store.close()


async def test_eight_connections_append_200_turns_each(namespace: str) -> None:
    from contextmode.store.redis import RedisStore

    await check_concurrent_writers([RedisStore(URL, namespace=namespace) for _ in range(8)])


async def test_every_key_is_under_the_namespace(namespace: str) -> None:
    import redis.asyncio as aioredis

    from contextmode.store.redis import RedisStore

    async with RedisStore(URL, namespace=namespace) as store:
        await store.append("t", "s", new_turns(3))
        await store.set_emotions("t", "s", {1: 0.9})
        await store.record_job("t", "s", "summary", ok=True)
        async with store.lock("t", "s"):
            client = aioredis.Redis.from_url(URL, decode_responses=True)
            keys = [key async for key in client.scan_iter(match=f"{namespace}*")]
            await client.aclose()
    assert len(keys) >= 7
    assert all(key.startswith(namespace) for key in keys)
