"""Plain data that travels between the layers: turns, derived records, session state.

Every record is a frozen keyword-only dataclass. Derived records (summary,
constraints, emotion scores, last answer) carry the turn sequence number they
cover, so a background result computed from an older state can be recognised
and rejected instead of overwriting a newer one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, TypeAlias

from typing_extensions import TypeAliasType

from .errors import EmptyMessage, InputError, InvalidSessionId

__all__ = [
    "NOTICE_PREFIXES",
    "TOOL_KEYS",
    "ChatMessage",
    "Constraint",
    "ConstraintKind",
    "ImageRef",
    "JsonObject",
    "JsonValue",
    "ModelCall",
    "NewTurn",
    "Role",
    "SessionKey",
    "SessionState",
    "Summary",
    "ToolCall",
    "ToolResult",
    "Turn",
    "check_storable",
    "require_text",
    "tool_metadata",
    "utc_now",
    "validate_id",
]

Role = Literal["user", "assistant", "system", "tool"]
"""``tool`` is the result of one tool call (it answers the call id in ``tool_call_id``)."""
ConstraintKind = Literal["preference", "constraint", "identity", "fact"]

JsonValue = TypeAliasType(
    "JsonValue", "str | int | float | bool | list[JsonValue] | dict[str, JsonValue] | None"
)
"""A JSON value as `json.loads` returns it. A named recursive alias (PEP 695's, spelled for
Python 3.11): mypy checks it, and a pydantic model validates a field typed with it."""
JsonObject: TypeAlias = dict[str, JsonValue]
"""A JSON object (a request's content block, a wire message built for a client)."""

NOTICE_PREFIXES: tuple[str, ...] = ("（未配置模型）", "(No model configured)")
"""How the offline responder's notices begin (recognises notices stored before they were marked)."""

_ID_RE = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def validate_id(value: str, what: str = "session id") -> str:
    """Return ``value`` if it is a safe id (1–128 chars of ``[A-Za-z0-9._:-]``), else raise."""
    if not isinstance(value, str) or not _ID_RE.match(value) or value in {".", ".."}:
        raise InvalidSessionId(
            f"invalid {what} {value!r}: use 1-128 characters from A-Z a-z 0-9 . _ : -"
        )
    return value


def require_text(message: str) -> str:
    """Return ``message`` unless it is empty or only whitespace (then raise `EmptyMessage`)."""
    if not message.strip():
        raise EmptyMessage("the message is empty or only whitespace; type something to send")
    return message


_UNSTORABLE = re.compile(r"[\x00\ud800-\udfff]")
"""NUL (PostgreSQL refuses it in text) and lone UTF-16 surrogates (JSON ``"\\ud800"``: no
character at all, no store or encoder takes them)."""


def check_storable(value: object, where: str) -> None:
    """Raise `InputError` naming the first string inside ``value`` (strings, lists, tuples and
    dict keys and values, walked) that holds a NUL or a lone surrogate: no store can keep it.

    ``where`` names ``value`` in the message (``messages[2].content``)."""
    todo: list[tuple[str, object]] = [(where, value)]
    while todo:
        path, item = todo.pop()
        if isinstance(item, str):
            # Fast paths first (a tool result may be megabytes): NUL by memchr, and an ASCII-only
            # string (a flag CPython keeps) holds no surrogate.
            if "\x00" not in item and item.isascii():
                continue
            if found := _UNSTORABLE.search(item):
                what = "NUL character U+0000" if found.group() == "\x00" else f"lone surrogate U+{ord(found.group()):04X}"
                raise InputError(f"{path} contains a {what} at position {found.start()}; send valid Unicode text")
        elif isinstance(item, Mapping):
            for key, inner in reversed(list(item.items())):
                todo.append((f"{path} (key)", key))
                todo.append((f"{path}.{key}" if isinstance(key, str) and key.isidentifier() else f"{path}[{key!r}]", inner))
        elif isinstance(item, (list, tuple)):
            todo.extend((f"{path}[{i}]", inner) for i, inner in reversed(list(enumerate(item))))


@dataclass(frozen=True, slots=True, order=True)
class SessionKey:
    """A tenant and one of its sessions, both checked once when the key is made (keys sort by
    tenant, then session id).

    Built at the edge (an HTTP route, the proxy, the CLI, `ContextMode`); code
    that receives a ``SessionKey`` trusts it and checks nothing again.
    """

    tenant: str
    session_id: str

    def __post_init__(self) -> None:
        validate_id(self.tenant, "tenant")
        validate_id(self.session_id)


@dataclass(frozen=True, kw_only=True, slots=True)
class ImageRef:
    """An image the user sent with a message, as stored for the turn (its file is deleted after it)."""

    path: str
    type: str
    """Its media type (``image/png`` …)."""
    bytes: int


def utc_now() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


@dataclass(frozen=True, kw_only=True)
class ToolCall:
    """One tool call an assistant turn asked for (OpenAI's ``tool_calls[i]``)."""

    id: str
    """The call id a ``tool`` turn answers with ``tool_call_id``."""
    name: str
    """The function name."""
    arguments: str = "{}"
    """The arguments as the model wrote them (JSON text, kept verbatim)."""


@dataclass(frozen=True, kw_only=True)
class ToolResult:
    """The result of one tool call, as the client sends it back (an agent step's input)."""

    call_id: str
    """The id of the call it answers."""
    content: str
    """What the tool returned (text; JSON stays as text)."""


_TOOL_CALLS = "tool_calls"
_TOOL_CALL_ID = "tool_call_id"
_TOOL_NAME = "tool_name"
TOOL_KEYS: frozenset[str] = frozenset({_TOOL_CALLS, _TOOL_CALL_ID, _TOOL_NAME})
"""The metadata keys that hold a turn's agent fields in their stored form (`tool_metadata`)."""


def tool_metadata(
    *, tool_calls: Sequence[ToolCall] = (), tool_call_id: str | None = None, tool_name: str | None = None
) -> dict[str, Any]:
    """The agent fields of a turn in their stored form: the keys of its JSON metadata.

    Every store keeps tool calls and results append-only in the existing turn record, and
    data stored before they existed reads back unchanged (a turn without these keys is plain
    text). A turn's typed fields (`Turn.tool_calls`, `tool_call_id`, `tool_name`) are made from
    these keys when it is read, and write them when it is made (`NewTurn`).
    """
    meta: dict[str, Any] = {}
    if tool_calls:
        meta[_TOOL_CALLS] = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in tool_calls]
    if tool_call_id is not None:
        meta[_TOOL_CALL_ID] = tool_call_id
    if tool_name:
        meta[_TOOL_NAME] = tool_name
    return meta


def _calls_from(metadata: Mapping[str, Any]) -> tuple[ToolCall, ...]:
    raw = metadata.get(_TOOL_CALLS)
    if not isinstance(raw, list):
        return ()
    return tuple(
        ToolCall(id=str(c.get("id", "")), name=str(c.get("name", "")), arguments=str(c.get("arguments", "{}")))
        for c in raw
        if isinstance(c, Mapping)
    )


class _AgentFields:
    """The typed agent fields of a turn (shared by `NewTurn` and `Turn`), kept in step with their
    stored form in ``metadata`` (`tool_metadata`): made from it when the turn is read (a turn
    stored or exported before the fields existed included), written into it when the turn is
    made from typed values. The typed value wins when both are given."""

    metadata: Mapping[str, Any]
    tool_calls: tuple[ToolCall, ...]
    tool_call_id: str | None
    tool_name: str | None

    def _sync_agent_fields(self) -> None:
        meta = self.metadata
        stored = _TOOL_CALLS in meta or _TOOL_CALL_ID in meta or _TOOL_NAME in meta
        if not (stored or self.tool_calls or self.tool_call_id is not None or self.tool_name):
            return  # a plain turn: nothing to do (the common case, a few lookups)
        calls = tuple(self.tool_calls) or _calls_from(meta)
        call_id = self.tool_call_id
        if call_id is None and meta.get(_TOOL_CALL_ID) is not None:
            call_id = str(meta[_TOOL_CALL_ID])
        name = self.tool_name or (str(meta[_TOOL_NAME]) if meta.get(_TOOL_NAME) else None)
        agent = tool_metadata(tool_calls=calls, tool_call_id=call_id, tool_name=name)
        extras = {k: v for k, v in meta.items() if k not in TOOL_KEYS}
        object.__setattr__(self, "tool_calls", calls)
        object.__setattr__(self, "tool_call_id", call_id)
        object.__setattr__(self, "tool_name", name)
        object.__setattr__(self, "metadata", {**extras, **agent})


@dataclass(frozen=True, kw_only=True)
class NewTurn(_AgentFields):
    """A turn about to be appended; the store gives it its sequence number."""

    role: Role
    """Who spoke."""
    content: str
    """The text, verbatim."""
    tokens: int
    """Token count of the turn under the session's counter, computed once: ``content``
    plus, for agent items, the tool calls' names and arguments (`contextmode.tokens.count_turn`)."""
    created_at: datetime = field(default_factory=utc_now)
    """When it was said (UTC)."""
    emotion: float | None = None
    """Emotion intensity 0–1 if already known; usually scored later by a job."""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    """Free JSON-able extras (``partial``, ``image_count``, ``rewrite``…), and the agent fields
    in their stored form (`tool_metadata`; made from the typed fields)."""
    tool_calls: tuple[ToolCall, ...] = ()
    """Tool calls of an assistant turn, in the order the model made them (empty otherwise)."""
    tool_call_id: str | None = None
    """For a ``tool`` turn: the call it answers."""
    tool_name: str | None = None
    """For a ``tool`` turn: the function that produced it, when known."""

    def __post_init__(self) -> None:
        self._sync_agent_fields()


@dataclass(frozen=True, kw_only=True)
class Turn(_AgentFields):
    """One stored turn of the append-only log."""

    seq: int
    """Sequence number within the session, 1-based, without gaps."""
    role: Role
    """Who spoke."""
    content: str
    """The text, verbatim."""
    tokens: int
    """Token count of ``content`` (stored, never recounted)."""
    created_at: datetime
    """When it was said (UTC)."""
    emotion: float | None = None
    """Emotion intensity 0–1, ``None`` until scored."""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    """Free JSON-able extras, and the agent fields in their stored form (`tool_metadata`)."""
    tool_calls: tuple[ToolCall, ...] = ()
    """Tool calls of an assistant turn, in the order the model made them (empty otherwise)."""
    tool_call_id: str | None = None
    """For a ``tool`` turn: the call it answers."""
    tool_name: str | None = None
    """For a ``tool`` turn: the function that produced it, when known."""

    def __post_init__(self) -> None:
        self._sync_agent_fields()

    @property
    def partial(self) -> bool:
        """True for an assistant answer whose stream broke before the end."""
        return bool(self.metadata.get("partial"))

    @property
    def notice(self) -> bool:
        """True for an engine notice (the offline responder's "no model configured" text):
        shown to the user, never remembered (summaries, pins, recall, key moments, rewrites)."""
        if self.metadata.get("notice") or self.metadata.get("offline"):
            return True
        return self.role == "assistant" and self.content.lstrip().startswith(NOTICE_PREFIXES)


@dataclass(frozen=True, kw_only=True)
class Summary:
    """An incremental summary of turns ``1..covers_seq``."""

    text: str
    """The summary text."""
    covers_seq: int
    """Last turn sequence number the summary covers (inclusive)."""
    tokens: int
    """Token count of ``text``."""
    version: int = 1
    """Increases by one at every committed summary of the session."""
    created_at: datetime = field(default_factory=utc_now)
    """When it was committed."""


@dataclass(frozen=True, kw_only=True)
class Constraint:
    """A user constraint or fact pinned near the top of the prompt."""

    key: str
    """What it is about, normalised (``spice``, ``budget``, ``name``…); a newer value replaces an older one with the same key."""
    value: str
    """The constraint as a short phrase (``不要辣``, ``预算50元以内``)."""
    kind: ConstraintKind = "constraint"
    """Preference, hard constraint, identity fact or other fact."""
    source_seq: int = 0
    """The turn it came from."""
    quote: str = ""
    """The user's words it was taken from (kept as data, never as instructions)."""


@dataclass(frozen=True, kw_only=True)
class ChatMessage:
    """One message of an OpenAI-style chat request."""

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    """Assistant messages: the tool calls it made."""
    tool_call_id: str | None = None
    """``tool`` messages: the call this result answers."""


@dataclass(frozen=True, kw_only=True)
class SessionState:
    """What a turn needs of a session: derived records plus the uncovered tail.

    ``turns`` holds only the turns after ``summary.covers_seq`` (bounded by the
    loader), never the whole history; older turns are reached through indexes.
    """

    tenant: str
    session_id: str
    last_seq: int = 0
    """Sequence number of the newest stored turn (0 = empty session)."""
    turns: Sequence[Turn] = ()
    """The newest turns, oldest first (at least those the summary does not cover, bounded)."""
    summary: Summary | None = None
    """The latest committed summary."""
    constraints: Sequence[Constraint] = ()
    """Pinned constraints, in the order they were pinned."""
    constraints_version: int = 0
    """Bumped at each committed constraint change (compare-and-set)."""
    key_moments: Sequence[Turn] = ()
    """Older turns with a high emotion intensity (loaded through the emotion index)."""
    recalled: Sequence[Turn] = ()
    """Older turns relevant to the current message, best first (filled by a recaller)."""
    last_answer: str | None = None
    """The last assistant answer, kept even when its stream broke."""
    created_at: datetime | None = None
    updated_at: datetime | None = None

    @property
    def summary_covers_seq(self) -> int:
        """Last turn covered by the summary, 0 when there is none."""
        return self.summary.covers_seq if self.summary else 0


@dataclass(frozen=True, kw_only=True)
class ModelCall:
    """One model call, as a turn's trace shows it (logged by `models.calls.CallLog`)."""

    step: str
    """``reply``, or the processor's prompt (``detect@2``, ``constraints@3``…)."""
    priority: Literal["reply", "background"]
    """``reply``: on a turn's response path; ``background``: a job's."""
    session: str = ""
    """The session a background job worked for (empty when unknown)."""
    start_ms: float = 0.0
    """When the call asked for a slot, milliseconds from the start of the turn (negative:
    before it)."""
    wait_ms: float = 0.0
    """Time waiting for a free slot of the endpoint."""
    duration_ms: float = 0.0
    """Time from the slot to the call's end (or to when the trace was taken, while running)."""
    prompt_tokens: int | None = None
    """Input tokens as the server counted them, when it said."""
    completion_tokens: int | None = None
    """Output tokens: the server's count, else the streamed chunks."""
    outcome: str = "running"
    """``stop``, ``length``, ``stopped early: …``, ``preempted``, ``error: …`` or ``running``."""
