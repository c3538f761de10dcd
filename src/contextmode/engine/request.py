"""A turn's request and its events: what goes into `Engine.stream` and what comes out.

A `TurnRequest` is built once at the edge (an HTTP route, the proxy, the CLI,
`ContextMode`); making it checks the ids and the message, so the engine and
everything below it trust it. A streamed turn yields `Prepared`, then `Delta`
(and, for an agent step, `ToolCallPart`) events, then `Done`, or `Failed` when
the model failed after the user turn was stored (the partial answer is stored).
Each event is a frozen dataclass told apart by its ``kind``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from functools import cached_property
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, Literal

from ..assembly import Context
from ..errors import ModelError
from ..memory.strategies import Strategy
from ..models.base import Relay, ToolCallDelta, UpstreamReply
from ..processors.base import Detection, Rewrite
from ..settings import Mode
from ..types import (
    ChatMessage,
    ImageRef,
    SessionKey,
    SessionState,
    ToolCall,
    Turn,
    require_text,
    validate_id,
)
from .recalled import explain_recalled

if TYPE_CHECKING:
    from ..store.records import RecalledTurn

__all__ = [
    "USE_DEFAULT",
    "Delta",
    "Done",
    "Failed",
    "Prepared",
    "PreparedTurn",
    "ToolCallPart",
    "TurnEvent",
    "TurnRequest",
    "TurnResult",
    "Upstream",
    "UseDefault",
]


class UseDefault(Enum):
    """A per-turn option left to the engine's own value (``None`` is a value: "no system prompt")."""

    USE_DEFAULT = "USE_DEFAULT"


USE_DEFAULT: Final = UseDefault.USE_DEFAULT


@dataclass(frozen=True, kw_only=True, slots=True)
class TurnRequest:
    """One user message for one session, with this turn's options; checked when made."""

    key: SessionKey
    message: str
    mode: Mode | None = None
    """``None``: the engine's setting."""
    strategy: str | Strategy | None = None
    """``None``: the engine's setting."""
    system_prompt: str | UseDefault | None = USE_DEFAULT
    """This turn's system prompt (the proxy's ``system`` message); `USE_DEFAULT`: the engine's."""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    """Kept with the user turn."""
    images: Sequence[ImageRef] = ()
    """Images sent with the message (recorded in the user turn's metadata)."""
    user_id: str | None = None
    """Names the session's user (stored with the session by the first message that gives one)."""
    idempotency_key: str | None = None
    """The client's retry key (the HTTP edge replays a finished turn; the engine ignores it)."""
    now: datetime | None = None
    """The clock the context is assembled at (default: now)."""
    relay: Relay | None = None
    """The client's own request fields, sent to a model that relays them (`RelayingModel`: the
    memory proxy); ``None``: the engine's own model call."""
    retry_window_s: float = 0.0
    """When the session's last turn is this same message, stored less than this many seconds
    ago and never answered (the model failed), the turn reuses it instead of storing it again:
    a client retrying a failed request stores one user turn. 0: never."""

    def __post_init__(self) -> None:
        require_text(self.message)
        if self.user_id is not None:
            validate_id(self.user_id, "user id")
        object.__setattr__(self, "metadata", MappingProxyType(dict(self.metadata)))
        object.__setattr__(self, "images", tuple(self.images))

    @property
    def tenant(self) -> str:
        return self.key.tenant

    @property
    def session_id(self) -> str:
        return self.key.session_id

    def turn_metadata(self) -> dict[str, Any]:
        """The user turn's metadata: the caller's, then its images."""
        meta = dict(self.metadata)
        if self.images:
            meta["image_count"] = len(self.images)
            meta["images"] = [{"path": i.path, "type": i.type, "bytes": i.bytes} for i in self.images]
        return meta


@dataclass(frozen=True, kw_only=True)
class PreparedTurn:
    """Everything decided before the model is called (nothing written yet)."""

    state: SessionState
    """The loaded session."""
    detection: Detection
    rewrite: Rewrite | None
    """The rewriter's verified output when the message needed context (``changed`` False
    when nothing was rewritten or the verifier refused the change)."""
    context: Context
    """Exactly what the model receives, with per-layer accounting."""
    messages: Sequence[ChatMessage]
    """``context`` as chat messages (what is sent)."""
    mode: Mode
    prepare_ms: float
    """Time spent loading, detecting, rewriting and assembling, milliseconds."""
    rejected_rewrite: Rewrite | None = None
    """A rewrite the verifier refused, with its ``reason`` (kept in the user turn's metadata)."""
    retried: Turn | None = None
    """The stored, unanswered user turn this one repeats (`TurnRequest.retry_window_s`): it is
    the turn's user turn, not stored again (and not in ``state``'s history)."""

    @cached_property
    def recalled_turns(self) -> tuple[RecalledTurn, ...]:
        """The older turns the context holds, each with why (`recalled.explain_recalled`),
        worked out once: the reply's ``context`` and the turn's trace both show them."""
        return explain_recalled(self.context, self.rewrite, self.state)


@dataclass(frozen=True, kw_only=True)
class TurnResult:
    """A finished turn."""

    answer: str
    partial: bool
    """True when the model's stream broke before the end (the partial answer is stored)."""
    user_turn: Turn
    assistant_turn: Turn | None
    prepared: PreparedTurn
    jobs: Sequence[str] = ()
    """Background jobs scheduled after the turn."""
    ttft_ms: float | None = None
    """Time to first token, milliseconds from the start of the turn."""
    model_ms: float = 0.0
    """Time spent streaming the model's answer, milliseconds."""
    error: str | None = None
    """The model error that cut the answer short, if any."""
    tool_calls: tuple[ToolCall, ...] = ()
    """The tool calls the model made (agent turns); the client runs them and sends the results."""
    finish_reason: str | None = None
    """Why a relayed reply ended, as the endpoint said (``stop``, ``length``, ``tool_calls``…;
    `TurnRequest.relay`); ``None`` otherwise."""
    stop_sequence: str | None = None
    """The stop string a relayed reply met, when the endpoint names it (vLLM's ``stop_reason``)."""
    usage: Mapping[str, object] | None = None
    """A relayed reply's usage, as the endpoint reported it."""
    upstream: UpstreamReply | None = None
    """A relayed, not streamed, reply: the endpoint's whole completion, as it sent it."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Prepared:
    """The turn is prepared (context, detection, rewrite); the user turn is stored next."""

    prepared: PreparedTurn
    kind: Literal["prepared"] = "prepared"


@dataclass(frozen=True, kw_only=True, slots=True)
class Delta:
    """A piece of the answer's text."""

    text: str
    kind: Literal["delta"] = "delta"


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolCallPart:
    """A piece of a tool call the model is making (agent steps)."""

    call: ToolCallDelta
    kind: Literal["tool_call"] = "tool_call"


@dataclass(frozen=True, kw_only=True, slots=True)
class Done:
    """The turn finished; its answer is stored."""

    result: TurnResult
    kind: Literal["done"] = "done"

    @property
    def text(self) -> str:
        """The whole answer."""
        return self.result.answer


@dataclass(frozen=True, kw_only=True, slots=True)
class Failed:
    """The model failed after the user turn was stored; the text so far is stored as a partial answer.

    The last event of its stream. `Engine.turn` raises ``error``.
    """

    error: ModelError
    partial_answer: str
    """The answer's text before the failure (stored, marked partial, when not empty)."""
    prepared: PreparedTurn
    kind: Literal["failed"] = "failed"


@dataclass(frozen=True, kw_only=True, slots=True)
class Upstream:
    """What the model endpoint sent for a relayed request (`TurnRequest.relay`), as it sent it."""

    reply: UpstreamReply
    kind: Literal["upstream"] = "upstream"


TurnEvent = Prepared | Delta | ToolCallPart | Upstream | Done | Failed
"""One event of a streamed turn (match on ``kind``)."""
