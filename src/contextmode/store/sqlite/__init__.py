"""The SQLite backend: `SQLiteStore` over `SQLiteDriver`, with its schema migrations
(``schema.py``), postings, lifecycle, admin statements, traces and row decoders."""

from __future__ import annotations

from os import PathLike

from ..front import IndexedFront
from .driver import SQLiteDriver

__all__ = ["SQLiteDriver", "SQLiteStore"]


class SQLiteStore(IndexedFront[SQLiteDriver]):
    """A `Store` in one SQLite file (WAL mode); see `SQLiteDriver` for the options."""

    def __init__(
        self, path: str | PathLike[str], *, busy_timeout_s: float = 30.0, synchronous: str = "NORMAL"
    ) -> None:
        super().__init__(SQLiteDriver(path, busy_timeout_s=busy_timeout_s, synchronous=synchronous))
        self.path = self.driver.path
        """The database file."""
