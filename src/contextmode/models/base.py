"""The `ChatModel` seam: anything that turns chat messages into a streamed answer."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Protocol, runtime_checkable

from ..types import ChatMessage

__all__ = ["ChatModel"]


@runtime_checkable
class ChatModel(Protocol):
    name: str
    """Model name as configured (used to pick the token counter)."""

    def stream(
        self, messages: Sequence[ChatMessage], *, max_tokens: int | None = None
    ) -> AsyncIterator[str]:
        """Yield the answer's text deltas; raise `ModelError` subclasses on failure."""
        ...

    async def complete(
        self, messages: Sequence[ChatMessage], *, max_tokens: int | None = None
    ) -> str:
        """The whole answer at once."""
        ...
