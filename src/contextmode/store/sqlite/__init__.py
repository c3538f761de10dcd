"""The SQLite backend: its driver, schema migrations, postings, lifecycle and row decoders."""

from .driver import SQLiteStore

__all__ = ["SQLiteStore"]
