"""Stores: the append-only turn log and its derived records."""

from .base import (
    DerivedRecords,
    JobLocks,
    JobStats,
    LockHandle,
    SessionAdmin,
    SessionInfo,
    Store,
    TurnLog,
)
from .memory import MemoryStore

__all__ = [
    "DerivedRecords",
    "JobLocks",
    "JobStats",
    "LockHandle",
    "MemoryStore",
    "SessionAdmin",
    "SessionInfo",
    "Store",
    "TurnLog",
]
