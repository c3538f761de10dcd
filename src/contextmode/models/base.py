"""The `ChatModel` seam: anything that turns chat messages into a streamed answer.

`StructuredChatModel` is the optional second seam of a model that can be asked
for JSON fitting a schema on the wire (`OpenAIChatModel` is one); processors
fall back to the prompt alone for a model that is not.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from ..types import ChatMessage

__all__ = ["ChatModel", "JsonSchema", "StructuredChatModel"]


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


@dataclass(frozen=True, kw_only=True)
class JsonSchema:
    """A named JSON Schema an answer must fit (sent as the request's ``response_format``)."""

    name: str
    """Identifier sent with the schema (letters, digits, ``_``)."""
    schema: Mapping[str, object] = field(hash=False)
    """The JSON Schema document."""


@runtime_checkable
class StructuredChatModel(ChatModel, Protocol):
    """A `ChatModel` that can constrain an answer to a JSON Schema."""

    async def complete_json(
        self, messages: Sequence[ChatMessage], *, schema: JsonSchema, max_tokens: int | None = None
    ) -> str:
        """The whole answer, asked to fit ``schema`` (the text still needs validating)."""
        ...
