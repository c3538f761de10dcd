"""Redis store: the contract and 8 concurrent writers (needs the test server)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from contextmode.testing.backends import REDIS_URL, fresh_store_url
from contextmode.testing.contract import (
    StoreContract,
    check_appends_after_another_worker_index_right,
    check_concurrent_writers,
    new_turns,
)
from contextmode.types import SessionKey

pytestmark = pytest.mark.redis


@pytest.fixture
async def namespace(tmp_path: Path) -> AsyncIterator[str]:
    """A key prefix nobody else writes under (its keys are deleted afterwards)."""
    async with fresh_store_url("redis", tmp_path) as url:
        yield url.partition("?namespace=")[2]


class TestRedisStore(StoreContract):
    @pytest.fixture
    async def store(self, namespace: str) -> AsyncIterator[object]:
        from contextmode.store.redis import RedisStore

        store = RedisStore(REDIS_URL, namespace=namespace)
        yield store
        await store.close()


async def test_eight_connections_append_200_turns_each(namespace: str) -> None:
    from contextmode.store.redis import RedisStore

    await check_concurrent_writers([RedisStore(REDIS_URL, namespace=namespace) for _ in range(8)])


async def test_every_key_is_under_the_namespace(namespace: str) -> None:
    import redis.asyncio as aioredis

    from contextmode.store.redis import RedisStore

    async with RedisStore(REDIS_URL, namespace=namespace) as store:
        await store.append(SessionKey("t", "s"), new_turns(3))
        await store.set_emotions(SessionKey("t", "s"), {1: 0.9})
        await store.record_job(SessionKey("t", "s"), "summary", ok=True)
        async with store.lock(SessionKey("t", "s")):
            client = aioredis.Redis.from_url(REDIS_URL, decode_responses=True)
            keys = [key async for key in client.scan_iter(match=f"{namespace}*")]
            await client.aclose()
    assert len(keys) >= 7
    assert all(key.startswith(namespace) for key in keys)


async def test_a_worker_appending_after_another_or_after_a_recreation_indexes_right(namespace: str) -> None:
    from contextmode.store.redis import RedisStore

    async with RedisStore(REDIS_URL, namespace=namespace) as one, RedisStore(REDIS_URL, namespace=namespace) as two:
        await check_appends_after_another_worker_index_right(one, two)
        await two.append(SessionKey("t", "s"), new_turns(2))
        assert await two.delete(SessionKey("t", "s"))
        assert ("t", "s") not in two.driver._heads  # the turn it kept for its next append went with it


async def test_a_batch_of_more_rows_than_a_script_chunk_is_indexed_whole(namespace: str) -> None:
    """One append of 1,200 turns with words of their own (over 1,000 postings rows and terms,
    the chunk the script reads and writes at once; Chinese terms whose byte length differs from
    their character count), then single turns after it: the index equals the log's."""
    from contextmode.store.redis import RedisStore
    from contextmode.testing.contract import _index_matches_the_log
    from contextmode.types import NewTurn

    async with RedisStore(REDIS_URL, namespace=namespace) as store:
        await store.append(SessionKey("t", "s"), [
            NewTurn(role="user", content=f"word{i} {'我妹妹下个月结婚' if i % 7 == 0 else 'plain'}", tokens=2)
            for i in range(1200)
        ])
        for i in range(3):
            await store.append(SessionKey("t", "s"), [NewTurn(role="assistant", content=f"word{i} 明天去医院复查", tokens=2)])
        await _index_matches_the_log(store, "t", "s")
