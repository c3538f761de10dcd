"""The store contract on the in-process backends (memory, SQLite)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from contextmode.store import MemoryStore
from contextmode.store.sqlite import SQLiteStore
from contextmode.testing.contract import StoreContract


class TestMemoryStore(StoreContract):
    @pytest.fixture
    async def store(self) -> AsyncIterator[MemoryStore]:
        store = MemoryStore()
        yield store
        await store.close()


class TestSQLiteStore(StoreContract):
    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[SQLiteStore]:
        store = SQLiteStore(tmp_path / "contextmode.db")
        yield store
        await store.close()
