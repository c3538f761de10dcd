"""The `ChatModel` seam: anything that turns chat messages into a streamed answer.

`StructuredChatModel` is the optional second seam of a model that can be asked
for JSON fitting a schema on the wire (`OpenAIChatModel` is one); processors
fall back to the prompt alone for a model that is not.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeGuard, runtime_checkable

from .._protocols import implements
from ..types import ChatMessage

__all__ = [
    "ChatModel",
    "ClosingModel",
    "JsonSchema",
    "ModelEvent",
    "NoticeModel",
    "Relay",
    "RelayingModel",
    "StructuredChatModel",
    "TextDelta",
    "ToolCallDelta",
    "ToolCallingModel",
    "ToolChoice",
    "ToolSpec",
    "UpstreamReply",
    "answers_to_schema",
    "answers_with_notices",
    "calls_tools",
    "closes",
    "relays",
]

ToolSpec = Mapping[str, object]
"""One tool definition in OpenAI's shape (``{"type": "function", "function": {...}}``), passed through."""
ToolChoice = str | Mapping[str, object]
"""``"auto"``, ``"none"``, ``"required"`` or ``{"type": "function", "function": {"name": ...}}``."""


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


def answers_to_schema(model: ChatModel) -> TypeGuard[StructuredChatModel]:
    """True when ``model`` can be asked for an answer that fits a JSON Schema."""
    return implements(model, StructuredChatModel)


@dataclass(frozen=True, kw_only=True)
class TextDelta:
    """A piece of the answer's text."""

    kind: Literal["text"] = "text"
    text: str


@dataclass(frozen=True, kw_only=True)
class ToolCallDelta:
    """A piece of one tool call, as OpenAI streams it: the first piece of call ``index``
    carries its id and name, later ones more of its arguments."""

    kind: Literal["tool_call"] = "tool_call"
    index: int
    """Which call of the answer (0-based); parallel calls have different indexes."""
    id: str | None = None
    name: str | None = None
    arguments: str = ""
    """The next characters of the arguments' JSON text."""


ModelEvent = TextDelta | ToolCallDelta
"""What a tool-calling model streams; readers ``match`` on ``kind``."""


@runtime_checkable
class ToolCallingModel(ChatModel, Protocol):
    """A model that can answer with tool calls (an ability apart from `ChatModel`)."""

    def stream_events(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[ToolSpec] = (),
        tool_choice: ToolChoice | None = None,
        max_tokens: int | None = None,
    ) -> AsyncIterator[ModelEvent]:
        """Yield text and tool-call deltas; raise `ModelError` subclasses on failure."""
        ...


def calls_tools(model: ChatModel) -> TypeGuard[ToolCallingModel]:
    """True when ``model`` can be given tools and answer with tool calls."""
    return implements(model, ToolCallingModel)


@runtime_checkable
class ClosingModel(Protocol):
    """A model that holds resources to close (its HTTP client): `OpenAIChatModel`."""

    async def aclose(self) -> None:
        """Close the model's HTTP client."""
        ...


def closes(model: object) -> TypeGuard[ClosingModel]:
    """True when ``model`` has an HTTP client (or other resources) to close."""
    return implements(model, ClosingModel)


@runtime_checkable
class NoticeModel(ChatModel, Protocol):
    """A model whose answers describe the request instead of answering it (`OfflineResponder`,
    the answer when no model is configured): the engine stores them as engine notices, shown
    to the user and never remembered."""

    @property
    def answers_are_notices(self) -> bool:
        """True when every answer is a notice (a wrapper may say False)."""
        ...


def answers_with_notices(model: ChatModel) -> bool:
    """True when ``model``'s answers are engine notices, not answers (`NoticeModel`)."""
    return _notices(model) and model.answers_are_notices


def _notices(model: ChatModel) -> TypeGuard[NoticeModel]:
    return implements(model, NoticeModel)


@dataclass(frozen=True, kw_only=True)
class Relay:
    """A client's own chat-completions request, for a model that relays it (the memory proxy).

    ``fields`` are the request's fields as the client sent them (OpenAI's names: sampling,
    ``response_format``, ``n``, ``logprobs``, ``stop``, ``tools``, ``stream_options``, unknown
    ones…), sent to the endpoint unchanged; the model owns ``model`` and ``stream``, the caller
    ``messages`` (memory composes them) and the length cap (see `RelayingModel.relay`)."""

    fields: Mapping[str, object] = field(default_factory=dict, hash=False)
    stream: bool = False
    """Ask the endpoint for a chunk stream (the client asked for one)."""
    images: tuple[str, ...] = ()
    """``data:`` URLs of the current message's images, sent with it (the last ``user`` message)
    as ``image_url`` parts: a vision model sees them for this turn; they are not stored."""


@dataclass(frozen=True, kw_only=True)
class UpstreamReply:
    """What the endpoint sent, as it sent it: one chunk of a stream, or the whole completion. A
    stream starts with one whose ``data`` is empty: the endpoint accepted the request (its
    status and headers are in; no chunk yet), so a caller can answer before the first token."""

    kind: Literal["upstream"] = "upstream"
    data: Mapping[str, object] = field(hash=False)
    """The JSON object (``chat.completion.chunk`` or ``chat.completion``); empty: accepted."""
    headers: Mapping[str, str] = field(default_factory=dict, hash=False)
    """The endpoint's response headers worth passing on (``x-request-id``…), on the first only."""

    @property
    def accepted_only(self) -> bool:
        """True for the empty reply that opens a stream (nothing to pass on but its headers)."""
        return not self.data


@runtime_checkable
class RelayingModel(ChatModel, Protocol):
    """A model that can send a client's request as the client composed it (`OpenAIChatModel`)."""

    def relay(
        self, messages: Sequence[ChatMessage] | None, relay: Relay, *, max_tokens: int | None = None
    ) -> AsyncIterator[ModelEvent | UpstreamReply]:
        """Send ``relay.fields`` with ``messages`` (``None``: the fields' own ``messages``, a call
        without memory) and yield, for each thing the endpoint sent, the `UpstreamReply` then the
        first choice's text and tool-call deltas. ``max_tokens`` caps the reply (the client's own
        ``max_tokens`` / ``max_completion_tokens`` when smaller). Errors: `ModelRateLimited`,
        `ModelOverloaded`, `ModelRefused` (the endpoint found the client's fields invalid), and
        the other `ModelError` s; the call is not retried (the client's SDK retries)."""
        ...


def relays(model: ChatModel) -> TypeGuard[RelayingModel]:
    """True when ``model`` can relay a client's own request (`RelayingModel`)."""
    return implements(model, RelayingModel)
