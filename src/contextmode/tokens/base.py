"""The `TokenCounter` seam: how many tokens a text or a chat request costs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

__all__ = ["RoleAwareCounter", "TokenCounter"]


@runtime_checkable
class TokenCounter(Protocol):
    """Counts tokens for one model family.

    ``exact`` is True when the count is the model's own tokenizer's; an
    estimator says False, and every accounting that uses it reports so.
    """

    name: str
    """Encoding name (``o200k_base``, ``qwen2``, ``estimate``…)."""
    exact: bool
    """True for the model's own tokenizer, False for an estimate."""
    message_overhead: int
    """Tokens a chat format adds around each message (role markers, separators)."""
    reply_overhead: int
    """Tokens the chat format adds once to prime the reply."""

    def count(self, text: str) -> int:
        """Tokens of ``text`` alone, without any chat-format overhead."""
        ...


@runtime_checkable
class RoleAwareCounter(TokenCounter, Protocol):
    """A counter whose chat format adds a different overhead per role.

    DeepSeek's template, for one, wraps a user message in one marker token, an
    assistant message in two and a system message in none. ``message_overhead``
    then holds the largest of them, so code that ignores roles over-counts
    (safe for a budget) instead of under-counting.
    """

    role_overheads: Mapping[str, int]
    """Tokens the chat format adds around one message of each role."""
