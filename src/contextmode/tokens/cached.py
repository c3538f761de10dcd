"""An LRU cache around any counter, so a text seen again is not tokenized again."""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from types import MappingProxyType

from .base import TokenCounter

__all__ = ["CachedCounter"]


class CachedCounter:
    """Wraps a ``TokenCounter``; repeats of a text are answered from an LRU cache.

    Turns are counted once and their count stored (``Turn.tokens``); this helps
    the texts that are counted again on every request (summary, pinned
    constraints, templates). Texts longer than ``max_cached_chars`` are counted
    directly so the cache never pins large strings in memory.
    """

    def __init__(
        self, inner: TokenCounter, *, maxsize: int = 4096, max_cached_chars: int = 4096
    ) -> None:
        self.inner = inner
        self.name: str = inner.name
        self.exact: bool = inner.exact
        self.message_overhead: int = inner.message_overhead
        self.reply_overhead: int = inner.reply_overhead
        self.role_overheads: Mapping[str, int] = getattr(
            inner, "role_overheads", None
        ) or MappingProxyType({})
        self._max_cached_chars = max_cached_chars
        self._cached_count = lru_cache(maxsize=maxsize)(inner.count)

    def count(self, text: str) -> int:
        """Tokens of ``text`` alone, as the wrapped counter says."""
        if len(text) > self._max_cached_chars:
            return self.inner.count(text)
        return self._cached_count(text)

    def cache_info(self) -> tuple[int, int, int | None, int]:
        """``(hits, misses, maxsize, currsize)`` of the LRU cache."""
        return tuple(self._cached_count.cache_info())  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"CachedCounter({self.inner!r})"
