"""Stores: the append-only turn log and its derived records.

`open_store(url)` picks a backend; `SQLiteStore`, `PostgresStore` and
`RedisStore` are importable from their modules (the last two need the
``postgres``/``redis`` extras, loaded on first use).
"""

from .base import (
    DerivedRecords,
    JobLocks,
    JobStats,
    LockHandle,
    SessionAdmin,
    SessionInfo,
    SessionVersion,
    Store,
    TurnLog,
)
from .cache import SessionCache
from .factory import StoreSettings, default_store_url, open_store
from .memory import MemoryStore
from .sqlite import SQLiteStore

__all__ = [
    "DerivedRecords",
    "JobLocks",
    "JobStats",
    "LockHandle",
    "MemoryStore",
    "SQLiteStore",
    "SessionAdmin",
    "SessionCache",
    "SessionInfo",
    "SessionVersion",
    "Store",
    "StoreSettings",
    "TurnLog",
    "default_store_url",
    "open_store",
]
