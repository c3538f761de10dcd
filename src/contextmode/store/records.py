"""The kept trace of one exchange, as a store keeps it: exactly what the model received, and why.

A `TurnTrace` is written just after the reply (`engine.persist.TraceWrites`; readers
wait for a pending write) for every live turn, numbered by exchange: turn 7 is the session's seventh user
message. It answers "what did the model see at turn 7?" after the fact, for the
HTTP route ``GET /v1/sessions/{id}/turns/{n}/context``, ``contextmode inspect
SESSION --turn N`` and the web inspector. One JSON codec (`trace_to_json` /
`trace_from_json`) serves every backend; `trace_to_dict` is the public shape
(the route's ``data`` and the CLI's ``--json`` are the same dictionary).

These are records and their codec only, so the store (which keeps them) imports nothing
above it; the engine builds a trace from a prepared turn (`engine.trace.build_trace`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from ..types import ChatMessage, ModelCall, ToolCall, Turn

__all__ = [
    "PinUsed",
    "RecalledTurn",
    "TraceLayer",
    "TraceRewrite",
    "TraceSources",
    "TurnTrace",
    "TurnUsage",
    "cap_trace",
    "exchange_count",
    "message_from_dict",
    "message_to_dict",
    "trace_from_dict",
    "trace_from_json",
    "trace_to_dict",
    "trace_to_json",
]


@dataclass(frozen=True, kw_only=True)
class TraceLayer:
    """Token accounting of one layer as it was for this turn."""

    name: str
    allocated: int
    """Tokens the layer could use (after unused budget flowed)."""
    used: int
    """Tokens it cost in the rendered input."""
    items: int = 0
    dropped_seqs: Sequence[int] = ()
    """Candidate turns left out for lack of budget."""
    truncated: bool = False


@dataclass(frozen=True, kw_only=True)
class RecalledTurn:
    """An older turn brought back into the context, and why."""

    seq: int
    layer: str
    """``recall`` (relevant to the message) or ``key_moments`` (emotional turning point)."""
    why: str
    """Short human-readable reason (rank, emotion intensity)."""
    text: str
    score: float | None = None
    """Recall: its ranking score (BM25, or reciprocal-rank fusion with ``ranker``
    ``bm25+dense``; a neighbour's is its hit's, discounted). Key moments: the turn's
    emotion intensity 0–1."""
    matched: Sequence[str] = ()
    """Recall: the query's terms found in the turn (the message's own, or borrowed from
    the newest turns when the message is short); empty for a turn found through related
    terms (feedback) or brought in as a neighbour."""
    neighbour_of: int | None = None
    """Recall: set when the turn came in as the turn before hit ``neighbour_of`` (or, when
    its seq is higher, as the answer after a hit that asks)."""
    ranker: str = ""
    """Recall: ``bm25`` or ``bm25+dense``."""


@dataclass(frozen=True, kw_only=True)
class PinUsed:
    """A pinned constraint that reached the model."""

    key: str
    value: str
    source_seq: int


@dataclass(frozen=True, kw_only=True)
class TraceRewrite:
    """The rewriter's proposal and what the engine did with it."""

    text: str
    """The standalone question the rewriter proposed."""
    changed: bool
    """False when the rewriter kept the message as typed."""
    source: str
    """Which rewriter (``offline``, ``llm``)."""
    decision: str
    """``used``: the model received the rewrite instead of the message (decoupled mode);
    ``hint``: the model received the message as typed and the verified rewrite as a labelled
    hint (contextual mode); ``kept_original``: the rewrite was not given to the model;
    ``unchanged``: the rewriter changed nothing."""


@dataclass(frozen=True, kw_only=True)
class TraceSources:
    """Texts the store holds, or keeps once per session, that a trace's texts may refer to
    instead of copying them (`store.trace_pack`): never part of the trace's JSON."""

    turns: Mapping[int, str] = field(default_factory=dict)
    """Turn seq → its content exactly as stored (the turns the context showed)."""
    texts: Sequence[str] = ()
    """Texts stored nowhere else that turns repeat (system prompt, summary, pinned values):
    a store keeps each once per session, by hash, while a kept trace refers to it."""


@dataclass(frozen=True, kw_only=True)
class TurnUsage:
    """What one exchange's request cost: its tokens, how much of it a prompt cache could reuse,
    and its money (docs/caching.md)."""

    prompt_tokens: int
    """Input tokens: as the endpoint reported them, else as counted."""
    cacheable_tokens: int | None
    """Tokens at the start of the request that are a byte-identical prefix of the previous
    exchange's request (what a prompt cache can serve); ``None`` when the previous exchange's
    trace is not kept whole."""
    cached_tokens: int | None = None
    """Input tokens the endpoint billed as read from its cache, when it reports them."""
    completion_tokens: int | None = None
    """Output tokens, when the endpoint reports them."""
    price_family: str | None = None
    """The price table's family of the model (``openai``, ``anthropic``…); ``None``: no price."""
    usd: float | None = None
    """The exchange's money in US dollars: the reported cached tokens (else the cacheable ones)
    at the cache price, the rest at the input price, the reply at the output price."""
    session_usd: float | None = None
    """Money of the session so far: this exchange's plus the previous kept exchange's total."""


@dataclass(frozen=True, kw_only=True)
class TurnTrace:
    """One exchange as sent to the model."""

    turn: int
    """Exchange number: the n-th user message of the session (1-based)."""
    user_seq: int
    """Sequence number of the stored user message."""
    answer_seq: int | None
    """Sequence number of the stored answer (``None`` when nothing arrived)."""
    created_at: datetime
    typed: str
    """The message as the user typed it."""
    sent: str
    """The current message as the model received it (a rewrite or template expansion)."""
    follow_up: str | None = None
    """The follow-up intent answered from the last answer (``detail``, ``example``…), if any."""
    messages: Sequence[ChatMessage] = ()
    """Every message the model received, in order."""
    layers: Sequence[TraceLayer] = ()
    context_window: int = 0
    """The model's context window, tokens."""
    input_budget: int = 0
    """Tokens available for the input (window minus reply reserve)."""
    reply_reserve: int = 0
    total_tokens: int = 0
    """Tokens of the whole input as counted."""
    exact: bool = True
    """True when counted with the model's own tokenizer."""
    counter: str = ""
    strategy: str = ""
    mode: str = ""
    format: str = "messages"
    locale: str = ""
    needs_context: bool = False
    """The detector's verdict: the message leans on earlier turns."""
    intent: str | None = None
    """The follow-up intent the detector found (``pronoun``, ``example``…), if any."""
    detection_score: float = 0.0
    """The detector's confidence 0–1 that the message needs context."""
    detection_reason: str = ""
    rewrite: TraceRewrite | None = None
    recalled: Sequence[RecalledTurn] = ()
    pins: Sequence[PinUsed] = ()
    processors: Mapping[str, str] = field(default_factory=dict)
    """Seam name → implementation and version that served this turn."""
    model: str = ""
    prepare_ms: float = 0.0
    """Loading, detection, rewrite and assembly, milliseconds."""
    ttft_ms: float | None = None
    """Time to the first token, milliseconds from the start of the turn."""
    model_ms: float = 0.0
    """Time spent streaming the answer, milliseconds."""
    partial: bool = False
    """True when the answer's stream broke before the end."""
    cut: bool = False
    """True when the trace was larger than the size cap and message texts were shortened."""
    pii_masked: Mapping[str, int] = field(default_factory=dict)
    """Personal values masked in this exchange's stored turns, by kind (``{"phone": 1}``;
    ``EngineSettings(pii="mask")``); the trace's own texts are masked the same way."""
    model_calls: Sequence[ModelCall] = ()
    """The model calls made while the turn ran, its own (detection, rewrite, the reply) and the
    background jobs' sharing the server, each with its wait for a slot (`models.calls`)."""
    stopped: str | None = None
    """Why the reply was stopped before its end (it degenerated), when it was."""
    sources: TraceSources | None = field(default=None, compare=False, repr=False)
    """What the texts may refer to when stored (set by `build_trace`); not kept, not shown."""
    usage: TurnUsage | None = None
    """Tokens and money of the request (set when the trace is kept)."""


def message_to_dict(message: ChatMessage) -> dict[str, Any]:
    """A message as kept in a trace: role and content, plus tool calls or the answered call
    id when it has them (the shape of OpenAI's messages)."""
    data: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        data["tool_calls"] = [vars(c) for c in message.tool_calls]
    if message.tool_call_id is not None:
        data["tool_call_id"] = message.tool_call_id
    return data


def message_from_dict(data: dict[str, Any]) -> ChatMessage:
    """Inverse of `message_to_dict`."""
    return ChatMessage(
        role=data["role"], content=data["content"],
        tool_calls=tuple(ToolCall(**c) for c in data.get("tool_calls", ())),
        tool_call_id=data.get("tool_call_id"),
    )


def _plain(trace: TurnTrace) -> dict[str, Any]:
    """The trace as JSON-ready builtins; by hand, because `dataclasses.asdict` deep-copies
    every field and this runs on every turn."""
    data = dict(vars(trace))
    del data["sources"]
    data["created_at"] = trace.created_at.isoformat()
    data["messages"] = [message_to_dict(m) for m in trace.messages]
    data["layers"] = [{**vars(x), "dropped_seqs": list(x.dropped_seqs)} for x in trace.layers]
    data["recalled"] = [vars(r) for r in trace.recalled]
    data["pins"] = [vars(p) for p in trace.pins]
    data["processors"] = dict(trace.processors)
    data["rewrite"] = vars(trace.rewrite) if trace.rewrite is not None else None
    data["usage"] = vars(trace.usage) if trace.usage is not None else None
    data["model_calls"] = [vars(c) for c in trace.model_calls]
    return data


def trace_to_json(trace: TurnTrace) -> str:
    """Compact JSON of the trace (what every store keeps); times as ISO 8601 strings."""
    return json.dumps(_plain(trace), ensure_ascii=False, separators=(",", ":"))


def trace_to_dict(trace: TurnTrace) -> dict[str, Any]:
    """The public JSON shape: exactly `trace_to_json` decoded (lists, strings, numbers).

    Copied by hand (a fresh dictionary or list at every level, tuples as lists), not encoded
    and decoded, unless a value is not a plain JSON builtin (then through JSON, as it says)."""
    plain = _plain(trace)
    try:
        return {key: _json_copy(value) for key, value in plain.items()}
    except _NotPlain:
        data: dict[str, Any] = json.loads(trace_to_json(trace))
        return data


class _NotPlain(Exception):
    """A value JSON would change (a subclass, a key that is not a string…)."""


_SCALARS = (str, int, float, bool, type(None))


def _json_copy(value: Any) -> Any:
    """``value`` as ``json.loads(json.dumps(value))`` gives it, for plain builtins; `_NotPlain`
    for anything else."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is dict:
        if not all(type(k) is str for k in value):
            raise _NotPlain
        return {k: _json_copy(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [_json_copy(v) for v in value]
    raise _NotPlain


def trace_from_json(text: str) -> TurnTrace:
    """Inverse of `trace_to_json`; unknown keys (a newer writer) are ignored."""
    return trace_from_dict(json.loads(text))


def trace_from_dict(data: dict[str, Any]) -> TurnTrace:
    """Inverse of `trace_to_dict`; unknown keys (a newer writer) are ignored."""
    known = set(TurnTrace.__dataclass_fields__) - {"sources"}
    data = {k: v for k, v in data.items() if k in known}
    data["created_at"] = datetime.fromisoformat(data["created_at"])
    data["messages"] = tuple(message_from_dict(m) for m in data.get("messages", ()))
    data["layers"] = tuple(
        TraceLayer(**{**x, "dropped_seqs": tuple(x.get("dropped_seqs", ()))}) for x in data.get("layers", ())
    )
    data["recalled"] = tuple(
        RecalledTurn(**{**r, "matched": tuple(r.get("matched", ()))}) for r in data.get("recalled", ())
    )
    data["pins"] = tuple(PinUsed(**p) for p in data.get("pins", ()))
    if data.get("rewrite") is not None:
        data["rewrite"] = TraceRewrite(**data["rewrite"])
    if data.get("usage") is not None:
        known_usage = set(TurnUsage.__dataclass_fields__)
        data["usage"] = TurnUsage(**{k: v for k, v in data["usage"].items() if k in known_usage})
    data["model_calls"] = tuple(ModelCall(**c) for c in data.get("model_calls", ()))
    return TurnTrace(**data)


def _shorten(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [{len(text) - limit} characters cut by the trace size cap]"


def cap_trace(trace: TurnTrace, max_bytes: int) -> TurnTrace:
    """``trace`` if its JSON fits ``max_bytes`` (UTF-8), else a copy with long texts shortened.

    Every text (typed, sent, messages, recalled turns) is cut to the same number of
    characters, halved until the whole fits; the copy says ``cut=True``. Only the
    accounting fields are never cut. ``max_bytes`` 0 means no cap.
    """
    if max_bytes <= 0:
        return trace
    texts = [trace.typed, trace.sent, *(m.content for m in trace.messages), *(r.text for r in trace.recalled)]
    # At most 6 bytes of JSON per character (a \uXXXX escape) plus the fixed fields: most
    # traces are far below the cap and are not encoded twice.
    if 6 * sum(map(len, texts)) + 8192 + 256 * len(trace.layers) <= max_bytes:
        return trace
    if len(trace_to_json(trace).encode()) <= max_bytes:
        return trace
    limit = max_bytes // (4 * max(1, len(trace.messages) + len(trace.recalled) + 2))
    while True:
        cut = replace(
            trace,
            cut=True,
            typed=_shorten(trace.typed, limit),
            sent=_shorten(trace.sent, limit),
            messages=tuple(replace(m, content=_shorten(m.content, limit)) for m in trace.messages),
            recalled=tuple(replace(r, text=_shorten(r.text, limit)) for r in trace.recalled),
        )
        if limit == 0 or len(trace_to_json(cut).encode()) <= max_bytes:
            return cut
        limit //= 2


def exchange_count(turns: Sequence[Turn]) -> int | None:
    """The exchange number of the newest user turn in ``turns`` (a tail of the log).

    ``None`` when the tail does not tell: its newest user turn predates
    exchange numbering, or it holds no user turn.
    """
    for turn in reversed(turns):
        if turn.role == "user":
            number = turn.metadata.get("turn")
            return number if isinstance(number, int) else None
    return None
