"""Deterministic `ChatModel` fakes for tests (after pydantic-ai's ``FunctionModel``).

``FunctionModel(fn)`` computes each reply from the messages it received;
``ScriptedModel(replies)`` plays replies back in order. Both record every call
in ``calls``. A reply may be a string (one chunk), an iterable of chunks (to
stream), an exception (raised), or a `BrokenStream` (chunks, then an error, as
when a real stream breaks half-way).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeAlias

from ..errors import ModelError, UserError
from ..types import ChatMessage

__all__ = ["BrokenStream", "FunctionModel", "ModelCall", "Reply", "ScriptedModel", "collect_stream"]


@dataclass(frozen=True, kw_only=True)
class BrokenStream:
    """A reply that streams ``chunks`` and then raises ``error`` (default: a `ModelError`)."""

    chunks: Sequence[str] = ()
    """Text deltas delivered before the break."""
    error: BaseException = field(
        default_factory=lambda: ModelError("stream broke (BrokenStream fake)")
    )
    """What the stream raises after the chunks."""


Reply: TypeAlias = "str | Iterable[str] | BaseException | BrokenStream"
"""What a fake model can answer."""


@dataclass(frozen=True, kw_only=True)
class ModelCall:
    """One call a fake model received."""

    messages: tuple[ChatMessage, ...]
    """The messages, as sent."""
    max_tokens: int | None
    """The ``max_tokens`` argument."""
    method: Literal["stream", "complete"]
    """Which `ChatModel` method was called."""

    @property
    def last_user(self) -> str:
        """Content of the last user message ('' if none)."""
        return next((m.content for m in reversed(self.messages) if m.role == "user"), "")

    @property
    def system(self) -> str:
        """Content of the first system message ('' if none)."""
        return next((m.content for m in self.messages if m.role == "system"), "")


async def _play(reply: Reply) -> AsyncIterator[str]:
    if isinstance(reply, BaseException):
        raise reply
    if isinstance(reply, BrokenStream):
        for chunk in reply.chunks:
            yield chunk
            await asyncio.sleep(0)
        raise reply.error
    if isinstance(reply, str):
        yield reply
        return
    for chunk in reply:
        yield chunk
        await asyncio.sleep(0)


class _FakeModel:
    name: str
    calls: list[ModelCall]

    async def _reply(self, messages: tuple[ChatMessage, ...]) -> Reply:
        raise NotImplementedError

    def _record(self, messages: Sequence[ChatMessage], max_tokens: int | None, method: Literal["stream", "complete"]) -> tuple[ChatMessage, ...]:
        frozen = tuple(messages)
        self.calls.append(ModelCall(messages=frozen, max_tokens=max_tokens, method=method))
        return frozen

    async def stream(
        self, messages: Sequence[ChatMessage], *, max_tokens: int | None = None
    ) -> AsyncIterator[str]:
        """Stream the reply chunk by chunk."""
        reply = await self._reply(self._record(messages, max_tokens, "stream"))
        async for chunk in _play(reply):
            yield chunk

    async def complete(self, messages: Sequence[ChatMessage], *, max_tokens: int | None = None) -> str:
        """The reply joined into one string."""
        reply = await self._reply(self._record(messages, max_tokens, "complete"))
        return "".join([chunk async for chunk in _play(reply)])


class FunctionModel(_FakeModel):
    """A `ChatModel` whose reply is ``fn(messages)``.

    ``fn`` may be sync or async and may return a string, an iterable of chunks,
    a `BrokenStream`, or raise; an async generator function streams what it yields.
    """

    def __init__(
        self,
        fn: Callable[[Sequence[ChatMessage]], Reply | Awaitable[Reply]]
        | Callable[[Sequence[ChatMessage]], AsyncIterator[str]],
        *,
        name: str = "function-model",
    ) -> None:
        self.fn = fn
        self.name = name
        self.calls: list[ModelCall] = []

    def __repr__(self) -> str:
        return f"FunctionModel({getattr(self.fn, '__name__', self.fn)!r})"

    async def _reply(self, messages: tuple[ChatMessage, ...]) -> Reply:
        result = self.fn(messages)
        if inspect.isasyncgen(result):
            return [str(chunk) async for chunk in result]
        if inspect.isawaitable(result):
            result = await result
        return result  # type: ignore[return-value]


class ScriptedModel(_FakeModel):
    """A `ChatModel` that answers each call with the next of ``replies``.

    Running out of replies raises `UserError` (the test scripted too few).
    """

    def __init__(self, replies: Iterable[Reply], *, name: str = "scripted-model") -> None:
        self.replies: list[Reply] = list(replies)
        self.name = name
        self.calls: list[ModelCall] = []

    def __repr__(self) -> str:
        return f"ScriptedModel({len(self.replies)} replies left)"

    async def _reply(self, messages: tuple[ChatMessage, ...]) -> Reply:
        if not self.replies:
            raise UserError(f"ScriptedModel ran out of replies after {len(self.calls) - 1} calls")
        return self.replies.pop(0)


class _Streams(Protocol):
    def stream(self, messages: Sequence[ChatMessage]) -> AsyncIterator[str]: ...


async def collect_stream(
    model: _Streams, messages: Sequence[ChatMessage]
) -> tuple[list[str], ModelError | None]:
    """The chunks ``model.stream(messages)`` yields, and the `ModelError` that ended it (or None)."""
    chunks: list[str] = []
    try:
        async for chunk in model.stream(messages):
            chunks.append(chunk)
    except ModelError as exc:
        return chunks, exc
    return chunks, None
