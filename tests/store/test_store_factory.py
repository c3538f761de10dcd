"""open_store: URL schemes, the CONTEXTMODE_HOME default, lazy extras."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from contextmode.errors import ConfigError, MissingExtra
from contextmode.store import MemoryStore, SQLiteStore, Store, StoreSettings, open_store
from contextmode.store.factory import default_store_url
from contextmode.store.postgres import PostgresStore
from contextmode.store.redis import RedisStore
from contextmode.types import SessionKey


def test_memory_and_protocol() -> None:
    store = open_store("memory://")
    assert isinstance(store, MemoryStore)
    assert isinstance(store, Store)


def test_sqlite_paths_follow_sqlalchemy(tmp_path: Path) -> None:
    absolute = open_store(f"sqlite:///{tmp_path}/a.db?synchronous=full&busy_timeout=5")
    assert isinstance(absolute, SQLiteStore)
    assert absolute.path == f"{tmp_path}/a.db"
    relative = open_store("sqlite:///data/x.db")
    assert isinstance(relative, SQLiteStore) and relative.path == "data/x.db"
    assert isinstance(absolute, Store)
    with pytest.raises(ConfigError):
        open_store("sqlite:///x.db?synchronous=sometimes")
    with pytest.raises(ConfigError):
        open_store("sqlite://")


def test_default_is_sqlite_under_contextmode_home(tmp_path: Path) -> None:
    env = {"CONTEXTMODE_HOME": str(tmp_path / "home")}
    assert default_store_url(env) == f"sqlite:///{tmp_path}/home/contextmode.db"
    store = open_store(None, env=env)
    assert isinstance(store, SQLiteStore)
    assert store.path == f"{tmp_path}/home/contextmode.db"
    env["CONTEXTMODE_STORE_URL"] = "memory://"
    assert isinstance(open_store(env=env), MemoryStore)


async def test_default_store_works_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTEXTMODE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("CONTEXTMODE_STORE_URL", raising=False)
    store = open_store()
    from contextmode.testing.contract import new_turns

    await store.append(SessionKey("t", "s"), new_turns(2))
    await store.close()
    assert (tmp_path / "state" / "contextmode.db").exists()


def test_postgres_and_redis_options() -> None:
    pg = open_store("postgresql://postgres@127.0.0.1:5432/test?schema=cm_x&sslmode=disable")
    assert isinstance(pg, PostgresStore)
    assert (pg.schema, pg.dsn) == ("cm_x", "postgresql://postgres@127.0.0.1:5432/test?sslmode=disable")
    env = {"CONTEXTMODE_PG_SCHEMA": "from_env", "CONTEXTMODE_REDIS_NAMESPACE": "app:"}
    assert open_store("postgres://h/db", env=env).schema == "from_env"  # type: ignore[attr-defined]
    rd = open_store("redis://127.0.0.1:6379/0?namespace=ns1:", env=env)
    assert isinstance(rd, RedisStore)
    assert (rd.namespace, rd.url) == ("ns1:", "redis://127.0.0.1:6379/0")
    assert open_store("redis://127.0.0.1:6379/0", env=env).namespace == "app:"  # type: ignore[attr-defined]
    with pytest.raises(ConfigError):
        open_store("postgresql://h/db?schema=Robert');DROP")
    with pytest.raises(ConfigError):
        open_store("mongodb://h/db")
    assert StoreSettings.from_env({}).redis_namespace == "cm:"


async def test_missing_driver_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "asyncpg", None)
    monkeypatch.setitem(sys.modules, "redis.asyncio", None)
    with pytest.raises(MissingExtra, match=r"contextmode-engine\[postgres\]"):
        await open_store("postgresql://127.0.0.1/x").load(SessionKey("t", "s"))
    with pytest.raises(MissingExtra, match=r"contextmode-engine\[redis\]"):
        await open_store("redis://127.0.0.1:6379/0").load(SessionKey("t", "s"))


def test_public_surface_is_sorted_and_importable() -> None:
    import contextmode.jobs
    import contextmode.store
    import contextmode.testing.contract

    for module in (contextmode.store, contextmode.jobs, contextmode.testing.contract):
        assert list(module.__all__) == sorted(module.__all__)
        assert all(hasattr(module, name) for name in module.__all__)


async def test_closed_sqlite_store_says_so(tmp_path: Path) -> None:
    from contextmode.errors import StoreError

    store = open_store(f"sqlite:///{tmp_path}/c.db")
    await store.load(SessionKey("t", "s"))
    await store.close()
    await store.close()
    with pytest.raises(StoreError, match="closed"):
        await store.load(SessionKey("t", "s"))


def test_postgres_pool_size_comes_from_the_url() -> None:
    store = open_store("postgresql://u@127.0.0.1:5432/db?schema=s1&pool_min=2&pool_max=20")
    assert isinstance(store, PostgresStore)
    assert (store.driver._min_size, store.driver._max_size) == (2, 20)
    with pytest.raises(ConfigError):
        open_store("postgresql://u@127.0.0.1:5432/db?pool_max=many")
