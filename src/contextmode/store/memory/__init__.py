"""The in-memory backend (one process, nothing persisted): `MemoryStore` over `MemoryDriver`."""

from ..front import StoreFront
from .driver import MemoryDriver

__all__ = ["MemoryDriver", "MemoryStore"]


class MemoryStore(StoreFront[MemoryDriver]):
    """A `Store` in this process's memory (tests, demos, one-shot runs)."""

    def __init__(self) -> None:
        super().__init__(MemoryDriver())
