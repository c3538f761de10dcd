"""SessionCache: bounded, idle-evicting, never stale when another process writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from contextmode.errors import InvalidSessionId
from contextmode.store import MemoryStore, SessionCache
from contextmode.store.sqlite import SQLiteStore
from contextmode.testing.contract import new_turns
from contextmode.types import Constraint, SessionKey, Summary


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_serves_from_memory_until_another_process_writes(tmp_path: Path) -> None:
    path = tmp_path / "cache.db"
    async with SQLiteStore(path) as mine, SQLiteStore(path) as theirs:
        await mine.append(SessionKey("t", "s"), new_turns(4))
        cache = SessionCache(mine)
        first = await cache.get(SessionKey("t", "s"))
        assert await cache.get(SessionKey("t", "s")) is first
        assert cache.stats.hits == 1

        await theirs.append(SessionKey("t", "s"), new_turns(1, start=5))
        state = await cache.get(SessionKey("t", "s"))
        assert state.last_seq == 5 and state is not first

        for change in (
            theirs.commit_summary(SessionKey("t", "s"), Summary(text="s", covers_seq=2, tokens=1),
                                  expected_version=0),
            theirs.commit_constraints(SessionKey("t", "s"), [Constraint(key="k", value="v")],
                                      expected_version=0),
            theirs.set_emotions(SessionKey("t", "s"), {1: 0.9}),
        ):
            before = await cache.get(SessionKey("t", "s"))
            await change
            after = await cache.get(SessionKey("t", "s"))
            assert after is not before
        assert after.summary is not None and tuple(after.constraints)
        assert cache.stats.misses == 5


async def test_lru_bound_and_idle_eviction() -> None:
    store = MemoryStore()
    clock = FakeClock()
    cache = SessionCache(store, max_sessions=2, idle_s=1800, clock=clock)
    for sid in ("a", "b", "c"):
        await store.append(SessionKey("t", sid), new_turns(1))
        await cache.get(SessionKey("t", sid))
    assert len(cache) == 2 and cache.stats.evictions == 1
    clock.now += 1000
    await cache.get(SessionKey("t", "c"))
    clock.now += 1000  # "b" idle 2000 s, "c" idle 1000 s
    assert cache.evict_idle() == 1
    assert len(cache) == 1
    clock.now += 1801
    await cache.get(SessionKey("t", "a"))
    assert len(cache) == 1  # "c" went idle on the way


async def test_options_are_part_of_the_key_and_invalidate_drops_all() -> None:
    store = MemoryStore()
    await store.append(SessionKey("t", "s"), new_turns(20))
    cache = SessionCache(store)
    wide = await cache.get(SessionKey("t", "s"), recent=8, max_uncovered=200)
    narrow = await cache.get(SessionKey("t", "s"), recent=0, max_uncovered=0)
    assert len(wide.turns) == 20 and len(narrow.turns) == 0
    assert len(cache) == 2
    assert cache.invalidate(SessionKey("t", "s")) == 2
    assert len(cache) == 0
    with pytest.raises(InvalidSessionId):
        await cache.get(SessionKey("t", "../etc"))


async def test_deleted_session_is_not_served() -> None:
    store = MemoryStore()
    await store.append(SessionKey("t", "s"), new_turns(3))
    cache = SessionCache(store)
    await cache.get(SessionKey("t", "s"))
    await store.delete(SessionKey("t", "s"))
    assert (await cache.get(SessionKey("t", "s"))).last_seq == 0


async def test_session_recreated_by_another_process_is_reloaded(tmp_path: Path) -> None:
    path = tmp_path / "recreate.db"
    async with SQLiteStore(path) as mine, SQLiteStore(path) as theirs:
        await mine.append(SessionKey("t", "s"), new_turns(2, prefix="old"))
        cache = SessionCache(mine)
        assert (await cache.get(SessionKey("t", "s"))).turns[0].content.startswith("old")
        await theirs.delete(SessionKey("t", "s"))
        await theirs.append(SessionKey("t", "s"), new_turns(2, prefix="new"))
        state = await cache.get(SessionKey("t", "s"))
        assert state.last_seq == 2
        assert state.turns[0].content.startswith("new")
