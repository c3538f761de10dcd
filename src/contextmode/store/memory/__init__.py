"""The in-memory backend (one process, nothing persisted)."""

from .driver import MemoryStore

__all__ = ["MemoryStore"]
