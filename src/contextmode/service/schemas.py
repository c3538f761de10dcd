"""Pydantic models of the HTTP edge: requests, the ``{code, msg, data}`` envelope and its payloads."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Generic, Literal, TypeAlias, TypeVar

from pydantic import BaseModel, ConfigDict, Field, SkipValidation, StrictBool, model_validator

from ..engine import PreparedTurn, TurnResult
from ..engine.trace import recalled_turns
from ..session_keys import key_for_id
from ..store.base import SessionInfo
from ..store.lifecycle import DeletionRecord
from ..types import Constraint, JsonValue, Summary, ToolCall, Turn, check_storable

__all__ = [
    "ConstraintOut",
    "ContextOut",
    "DeletedOut",
    "DetectionOut",
    "Envelope",
    "ErrorEnvelope",
    "HealthOut",
    "ItemOut",
    "JobStatsOut",
    "LayerOut",
    "MessageOut",
    "MessageRequest",
    "RecalledOut",
    "RewriteOut",
    "SessionListOut",
    "SessionOut",
    "SessionStatsOut",
    "SessionSummaryOut",
    "SummaryOut",
    "TurnOut",
    "TurnRecord",
    "WireObject",
]

WireObject: TypeAlias = dict[str, SkipValidation[JsonValue]]
"""A JSON object of a request (a content block, a tool definition, ``metadata``): the object
and its string keys are checked, its values are taken as parsed (already JSON, and a proxy
request's history can be megabytes: not walked a second time)."""

T = TypeVar("T")

MAX_IMAGES_LISTED = 64
"""More images than this are refused before each is validated (the service's own limit is lower)."""


class MessageRequest(BaseModel):
    """``POST /v1/sessions/{id}/messages``."""

    model_config = ConfigDict(extra="forbid")

    message: str = Field(description="The user's new message (not empty, not only whitespace: 40005).")
    images: list[str] = Field(default_factory=list, description="Images as base64 data URLs (data:image/png;base64,…).")
    stream: StrictBool = Field(default=False, description="Stream the answer as server-sent events (true or false; strings and numbers are refused).")
    mode: Literal["contextual", "decoupled"] | None = Field(
        default=None, description="contextual: memory in the prompt; decoupled: memory only feeds the rewrite of the question."
    )
    user_id: str | None = Field(
        default=None,
        description="The user this session belongs to (kept from the first message that names one); "
        "lets DELETE /v1/users/{user_id} erase all their sessions.",
    )

    @model_validator(mode="before")
    @classmethod
    def _cheap_shape_check(cls, data: object) -> object:
        # One error for many unknown keys or images, instead of one per key (each costs time and bytes).
        if isinstance(data, dict):
            unknown = [key for key in data if key not in cls.model_fields]
            if unknown:
                shown = ", ".join(repr(str(key)[:40]) for key in unknown[:3])
                more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
                raise ValueError(f"unknown field(s) {shown}{more}; known: {', '.join(cls.model_fields)}")
            images = data.get("images")
            if isinstance(images, list) and len(images) > MAX_IMAGES_LISTED:
                raise ValueError(f"at most {MAX_IMAGES_LISTED} images per message, got {len(images)}")
        check_storable(data, "request")
        return data


class Envelope(BaseModel, Generic[T]):
    """Every non-stream response: ``code`` 0 on success, ``data`` the payload."""

    code: int = Field(description="0 on success, else an error code (code // 100 = HTTP status).")
    msg: str
    data: T | None = None


class ErrorEnvelope(BaseModel):
    """An error: ``data`` may carry details (validation errors)."""

    code: int
    msg: str
    data: Any = None


class DetectionOut(BaseModel):
    needs_context: bool
    score: float
    intent: str | None
    reason: str


class RewriteOut(BaseModel):
    text: str
    changed: bool
    source: str


class ToolCallOut(BaseModel):
    """One tool call of an assistant turn."""

    id: str
    name: str
    arguments: str = Field(description="The arguments' JSON text, as the model wrote it.")

    @classmethod
    def all(cls, calls: Sequence[ToolCall]) -> list[ToolCallOut]:
        return [cls(id=c.id, name=c.name, arguments=c.arguments) for c in calls]


class ItemOut(BaseModel):
    text: str
    tokens: int
    seq: int | None = None
    role: str | None = None
    truncated: bool = False
    emotion: float | None = Field(
        default=None, description="Key moments: the turn's emotion intensity 0–1 (why it is one)."
    )
    tool_calls: list[ToolCallOut] = Field(default_factory=list)
    tool_call_id: str | None = None


class LayerOut(BaseModel):
    """One layer: tokens allocated after budget flowed, used, and candidate turns dropped."""

    name: str
    title: str | None = None
    allocated: int
    used: int
    items: int
    dropped_seqs: list[int]
    truncated: bool
    rendered: str | None = None
    content: list[ItemOut] | None = None
    threshold: float | None = Field(
        default=None, description="Key moments: the intensity a turn must exceed (0.7: strongly emotional)."
    )


class RecalledOut(BaseModel):
    """An older turn in the context (recall or key moments), and why it is there."""

    seq: int
    layer: str = Field(description="``recall`` (relevant to the message) or ``key_moments``.")
    why: str
    score: float | None = Field(
        default=None,
        description="Recall: the ranking score (BM25, or rank fusion when ``ranker`` is bm25+dense);"
        " key moments: the emotion intensity 0–1.",
    )
    matched: list[str] = Field(default_factory=list, description="Recall: the query's terms found in the turn.")
    neighbour_of: int | None = Field(default=None, description="Recall: the hit this turn is the turn before.")
    ranker: str = ""
    text: str | None = Field(default=None, description="The turn as it reached the model (full context only).")


class MessageOut(BaseModel):
    role: str
    content: str
    tool_calls: list[ToolCallOut] = Field(default_factory=list)
    tool_call_id: str | None = None


def _key_moment_threshold(strategy: str) -> float | None:
    """The intensity a turn must exceed to be a key moment under ``strategy`` (if it has one)."""
    from ..errors import ConfigError
    from ..memory import get_strategy

    try:
        threshold = getattr(get_strategy(strategy), "threshold", None)
    except ConfigError:
        return None
    return float(threshold) if isinstance(threshold, int | float) else None


class ContextOut(BaseModel):
    """What the model receives for a message, per layer with tokens."""

    message: str = Field(description="The message as sent (the standalone rewrite when there is one).")
    original_message: str
    mode: str
    strategy: str
    format: str
    locale: str
    input_budget: int = Field(description="Tokens available for the input.")
    reply_reserve: int
    total_tokens: int
    exact: bool = Field(description="True when counted with the model's own tokenizer.")
    counter: str
    layers: list[LayerOut]
    dropped_seqs: list[int]
    detection: DetectionOut
    rewrite: RewriteOut | None
    messages: list[MessageOut] | None = None
    recalled: list[RecalledOut] = Field(
        default_factory=list, description="Older turns brought back (recall, key moments), with why."
    )
    prepare_ms: float

    @classmethod
    def of(cls, prepared: PreparedTurn, *, full: bool) -> ContextOut:
        """``full`` adds each layer's items and rendered text, and the messages sent."""
        ctx = prepared.context
        rendered = {layer.name: layer for layer in ctx.layers}
        emotions = {t.seq: t.emotion for t in (*prepared.state.key_moments, *prepared.state.turns)}
        threshold = _key_moment_threshold(ctx.strategy)
        layers = []
        for name, account in ctx.accounts.items():
            content = rendered.get(name)
            layers.append(
                LayerOut(
                    name=name,
                    title=content.title if content else None,
                    allocated=account.allocated,
                    used=account.used,
                    items=account.items,
                    dropped_seqs=list(account.dropped_seqs),
                    truncated=account.truncated,
                    rendered=(content.rendered if content else "") if full else None,
                    content=[
                        ItemOut(
                            text=i.text, tokens=i.tokens, seq=i.seq, role=i.role, truncated=i.truncated,
                            emotion=emotions.get(i.seq) if name == "key_moments" and i.seq is not None else None,
                            tool_calls=ToolCallOut.all(i.tool_calls), tool_call_id=i.tool_call_id,
                        )
                        for i in (content.items if content else ())
                    ]
                    if full
                    else None,
                    threshold=threshold if name == "key_moments" else None,
                )
            )
        d, rw = prepared.detection, prepared.rewrite
        return cls(
            message=ctx.message,
            original_message=ctx.original_message,
            mode=prepared.mode,
            strategy=ctx.strategy,
            format=ctx.format,
            locale=ctx.locale,
            input_budget=ctx.input_budget,
            reply_reserve=ctx.reply_reserve,
            total_tokens=ctx.total_tokens,
            exact=ctx.exact,
            counter=ctx.counter,
            layers=layers,
            dropped_seqs=list(ctx.dropped_seqs),
            detection=DetectionOut(needs_context=d.needs_context, score=d.score, intent=d.intent, reason=d.reason),
            rewrite=RewriteOut(text=rw.text, changed=rw.changed, source=rw.source) if rw else None,
            messages=[MessageOut(role=m.role, content=m.content, tool_calls=ToolCallOut.all(m.tool_calls),
                                 tool_call_id=m.tool_call_id) for m in prepared.messages] if full else None,
            recalled=[
                RecalledOut(seq=r.seq, layer=r.layer, why=r.why, score=r.score, matched=list(r.matched),
                            neighbour_of=r.neighbour_of, ranker=r.ranker, text=r.text if full else None)
                for r in recalled_turns(prepared)
            ],
            prepare_ms=round(prepared.prepare_ms, 3),
        )


class TurnOut(BaseModel):
    """A finished turn (non-stream answer)."""

    session_id: str
    answer: str
    partial: bool
    user_seq: int
    turn: int | None = Field(default=None, description="Exchange number: this is the session's n-th user message.")
    seq: int | None = Field(description="Sequence number of the stored answer (None when nothing arrived).")
    jobs: list[str]
    ttft_ms: float | None
    model_ms: float
    context: ContextOut

    @classmethod
    def of(cls, session_id: str, result: TurnResult) -> TurnOut:
        return cls(
            session_id=session_id,
            answer=result.answer,
            partial=result.partial,
            user_seq=result.user_turn.seq,
            turn=result.user_turn.metadata.get("turn"),
            seq=result.assistant_turn.seq if result.assistant_turn else None,
            jobs=list(result.jobs),
            ttft_ms=None if result.ttft_ms is None else round(result.ttft_ms, 3),
            model_ms=round(result.model_ms, 3),
            context=ContextOut.of(result.prepared, full=False),
        )


class TurnRecord(BaseModel):
    seq: int
    role: str
    content: str
    tokens: int
    created_at: datetime
    emotion: float | None
    partial: bool
    metadata: dict[str, Any]
    tool_calls: list[ToolCallOut] = Field(default_factory=list, description="Assistant turns: the tool calls made.")
    tool_call_id: str | None = Field(default=None, description="Tool results: the call answered.")

    @classmethod
    def of(cls, turn: Turn) -> TurnRecord:
        return cls(
            seq=turn.seq,
            role=turn.role,
            content=turn.content,
            tokens=turn.tokens,
            created_at=turn.created_at,
            emotion=turn.emotion,
            partial=turn.partial,
            metadata=dict(turn.metadata),
            tool_calls=ToolCallOut.all(turn.tool_calls),
            tool_call_id=turn.tool_call_id,
        )


class SummaryOut(BaseModel):
    text: str
    covers_seq: int
    tokens: int
    version: int
    created_at: datetime

    @classmethod
    def of(cls, s: Summary) -> SummaryOut:
        return cls(text=s.text, covers_seq=s.covers_seq, tokens=s.tokens, version=s.version, created_at=s.created_at)


class ConstraintOut(BaseModel):
    key: str
    value: str
    kind: str
    source_seq: int = Field(description="The turn the constraint came from.")
    quote: str

    @classmethod
    def of(cls, c: Constraint) -> ConstraintOut:
        return cls(key=c.key, value=c.value, kind=c.kind, source_seq=c.source_seq, quote=c.quote)


class JobStatsOut(BaseModel):
    ok: int
    failed: int
    rejected: int = 0
    last_error: str | None
    last_run: datetime | None


class SessionStatsOut(BaseModel):
    summary_covers_seq: int
    summary_version: int
    constraints_version: int
    jobs: dict[str, JobStatsOut]
    pending_jobs: list[str]


class StorageOut(BaseModel):
    """The bytes a session keeps, by kind of record (as ``contextmode stats`` prints them)."""

    session_id: str
    exchanges: int
    raw_text_bytes: int = Field(description="UTF-8 bytes of both roles' turns as typed and answered.")
    total_bytes: int
    per_exchange: int | None
    bytes: dict[str, int] = Field(description="Kind of record (turns, traces, recall_postings…) → bytes, largest first.")


class SessionOut(BaseModel):
    """A session: a page of history (oldest first), summary, constraints, stats."""

    session_id: str
    last_seq: int
    created_at: datetime
    updated_at: datetime
    turns: list[TurnRecord]
    next_before: int | None = Field(description="Pass as ?before= for the previous page; None on the first turn.")
    summary: SummaryOut | None
    constraints: list[ConstraintOut]
    last_answer: str | None
    stats: SessionStatsOut


class SessionSummaryOut(BaseModel):
    session_id: str
    key: str
    """The session's key as a framework adapter was given it (`session_keys.key_for_id`);
    the id itself for any other session."""
    last_seq: int
    created_at: datetime
    updated_at: datetime
    summary_covers_seq: int
    user_id: str | None = None

    @classmethod
    def of(cls, info: SessionInfo) -> SessionSummaryOut:
        return cls(
            session_id=info.session_id,
            key=key_for_id(info.session_id),
            last_seq=info.last_seq,
            created_at=info.created_at,
            updated_at=info.updated_at,
            summary_covers_seq=info.summary_covers_seq,
            user_id=info.user_id,
        )


class SessionListOut(BaseModel):
    sessions: list[SessionSummaryOut]
    limit: int
    offset: int


class DeletedOut(BaseModel):
    session_id: str
    deleted: bool
    counts: dict[str, int] = Field(default_factory=dict, description="Records erased per kind.")
    deletion_id: int | None = Field(default=None, description="The audit record of this deletion.")


class HealthOut(BaseModel):
    status: str
    store: str
    model: str


class UserOut(BaseModel):
    user_id: str
    sessions: int
    updated_at: datetime


class UserListOut(BaseModel):
    users: list[UserOut]
    limit: int
    offset: int


class DeletionOut(BaseModel):
    """A deletion record: who asked, when, what, how much went (never content)."""

    id: int
    scope: str
    target: str
    actor: str
    started_at: datetime
    finished_at: datetime | None
    counts: dict[str, int]

    @classmethod
    def of(cls, record: DeletionRecord) -> DeletionOut:
        return cls(id=record.id, scope=record.scope, target=record.target, actor=record.actor,
                   started_at=record.started_at, finished_at=record.finished_at, counts=dict(record.counts))


class DeletionListOut(BaseModel):
    deletions: list[DeletionOut]
