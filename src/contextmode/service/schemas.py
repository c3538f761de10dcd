"""Pydantic models of the HTTP edge: requests, the ``{code, msg, data}`` envelope and its payloads."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from ..engine import PreparedTurn, TurnResult
from ..store.base import SessionInfo
from ..store.lifecycle import DeletionRecord
from ..types import Constraint, Summary, Turn

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
    "RewriteOut",
    "SessionListOut",
    "SessionOut",
    "SessionStatsOut",
    "SessionSummaryOut",
    "SummaryOut",
    "TurnOut",
    "TurnRecord",
]

T = TypeVar("T")


class MessageRequest(BaseModel):
    """``POST /v1/sessions/{id}/messages``."""

    model_config = ConfigDict(extra="forbid")

    message: str = Field(min_length=1, description="The user's new message.")
    images: list[str] = Field(default_factory=list, description="Images as base64 data URLs (data:image/png;base64,…).")
    stream: bool = Field(default=False, description="Stream the answer as server-sent events.")
    mode: Literal["contextual", "decoupled"] | None = Field(
        default=None, description="contextual: memory in the prompt; decoupled: memory only feeds the rewrite (seed 002)."
    )
    user_id: str | None = Field(
        default=None,
        description="The user this session belongs to (kept from the first message that names one); "
        "lets DELETE /v1/users/{user_id} erase all their sessions.",
    )


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


class ItemOut(BaseModel):
    text: str
    tokens: int
    seq: int | None = None
    role: str | None = None
    truncated: bool = False


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


class MessageOut(BaseModel):
    role: str
    content: str


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
    prepare_ms: float

    @classmethod
    def of(cls, prepared: PreparedTurn, *, full: bool) -> ContextOut:
        """``full`` adds each layer's items and rendered text, and the messages sent."""
        ctx = prepared.context
        rendered = {layer.name: layer for layer in ctx.layers}
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
                        ItemOut(text=i.text, tokens=i.tokens, seq=i.seq, role=i.role, truncated=i.truncated)
                        for i in (content.items if content else ())
                    ]
                    if full
                    else None,
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
            messages=[MessageOut(role=m.role, content=m.content) for m in prepared.messages] if full else None,
            prepare_ms=round(prepared.prepare_ms, 3),
        )


class TurnOut(BaseModel):
    """A finished turn (non-stream answer)."""

    session_id: str
    answer: str
    partial: bool
    user_seq: int
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
    last_error: str | None
    last_run: datetime | None


class SessionStatsOut(BaseModel):
    summary_covers_seq: int
    summary_version: int
    constraints_version: int
    jobs: dict[str, JobStatsOut]
    pending_jobs: list[str]


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
    last_seq: int
    created_at: datetime
    updated_at: datetime
    summary_covers_seq: int
    user_id: str | None = None

    @classmethod
    def of(cls, info: SessionInfo) -> SessionSummaryOut:
        return cls(
            session_id=info.session_id,
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
