"""A deterministic token counter for tests: one token per CJK character or word."""

from __future__ import annotations

import re

__all__ = ["CharTokenCounter"]

_PIECE = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]|[A-Za-z0-9]+|[^\sA-Za-z0-9\u3400-\u9fff]")


class CharTokenCounter:
    """Counts one token per CJK character, per ASCII word and per other symbol.

    Exact by its own definition, which makes budgets in tests easy to reason about.
    """

    name = "test-chars"
    exact = True
    message_overhead = 4
    reply_overhead = 3

    def count(self, text: str) -> int:
        return len(_PIECE.findall(text))
