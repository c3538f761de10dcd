"""A trace built from what the engine prepared and measured (`build_trace`).

The records and their JSON codec live with the store that keeps them (`store.records`);
this module reads the prepared turn (context, detection, rewrite, recall) to fill them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..store.records import PinUsed, RecalledTurn, TraceLayer, TraceRewrite, TraceSources, TurnTrace
from ..store.trace_pack import chunked
from ..text.neutralise import neutralise
from ..types import ModelCall, Turn, utc_now

if TYPE_CHECKING:
    from ..assembly.context import Context
    from ..processors.base import Rewrite
    from ..types import Constraint
    from .request import PreparedTurn

__all__ = [
    "ExchangeOutcome",
    "build_trace",
    "recalled_turns",
    "trace_sources",
]


def recalled_turns(prepared: PreparedTurn) -> tuple[RecalledTurn, ...]:
    """The older turns the context holds (recall and key-moment layers), each with why:
    for recall the score, ranker and matched query terms (`memory.recall.explain_recall`
    on the query recall was given), for a key moment its emotion intensity.

    Worked out once per prepared turn (`PreparedTurn.recalled_turns`, by
    `engine.recalled.explain_recalled`): the reply and the trace ask for them both."""
    return prepared.recalled_turns


def _pins(context: Context, constraints: Sequence[Constraint]) -> tuple[PinUsed, ...]:
    layer = context.layer("constraints")
    lines = [item.text for item in layer.items] if layer else []
    return tuple(
        PinUsed(key=c.key, value=c.value, source_seq=c.source_seq)
        for c in constraints
        if any(c.value in line for line in lines)
    )


def _rewrite(context: Context, rewrite: Rewrite | None) -> TraceRewrite | None:
    if rewrite is None:
        return None
    if not rewrite.changed:
        decision = "unchanged"
    else:
        decision = (
            "used" if neutralise(context.message) == neutralise(rewrite.text)  # sent with control strings broken
            else "hint" if context.hint == rewrite.text
            else "kept_original"
        )
    return TraceRewrite(text=rewrite.text, changed=rewrite.changed, source=rewrite.source, decision=decision)


@dataclass(frozen=True, kw_only=True)
class ExchangeOutcome:
    """How an exchange ended, as the engine measured it."""

    turn: int
    """Exchange number."""
    user_seq: int
    answer_seq: int | None
    """``None`` when nothing arrived from the model."""
    ttft_ms: float | None
    model_ms: float
    partial: bool
    reported_prompt_tokens: int | None = None
    """Input tokens the endpoint reported for the call, if it did."""
    reported_cached_tokens: int | None = None
    """Input tokens the endpoint said it read from its prompt cache, if it did."""
    completion_tokens: int | None = None
    """Output tokens the endpoint reported, if it did."""
    model_calls: tuple[ModelCall, ...] = ()
    """The model calls made while the turn ran (`models.calls.CallLog.between`)."""
    stopped: str | None = None
    """Why the reply was stopped early, when it was."""


def trace_sources(prepared: PreparedTurn, stored: Sequence[Turn] = ()) -> TraceSources:
    """What this exchange's trace may refer to: every turn the session state held (window,
    key moments, recalled) and the turns the exchange stored, as stored; the summary, the
    pinned values, and for each layer that shows no turn (system prompt, pins, summary,
    instructions) the paragraphs of its items together. A paragraph of many lines (the pins,
    an extractive summary) is given in chunks of lines (`store.trace_pack.chunked`): a line
    added or changed changes one chunk, the others are kept texts already. A paragraph only
    this turn shows, the rewrite's hint, stays in the trace's own text."""
    state, ctx = prepared.state, prepared.context
    turns = {t.seq: t.content for group in (state.turns, state.key_moments, state.recalled, stored) for t in group}
    texts = _pieces(state.summary.text) if state.summary is not None else []
    texts += [c.value for c in state.constraints]
    for layer in ctx.layers:
        if layer.items and all(item.role is None for item in layer.items):
            block = "\n".join(item.text for item in layer.items)
            # The rewrite's hint is this turn's alone: it stays in the trace, not kept apart.
            parts = [part for part in block.split("\n\n") if not (ctx.hint and ctx.hint in part)]
            texts += [piece for part in parts for piece in _pieces(part)]
    return TraceSources(turns=turns, texts=tuple(dict.fromkeys(texts)))


_CHUNKED_LINES = 16
"""A paragraph of this many lines or more is given to the trace in chunks of lines."""


def _pieces(paragraph: str) -> list[str]:
    lines = paragraph.split("\n")
    if len(lines) < _CHUNKED_LINES:
        return [paragraph]
    return ["\n".join(chunk) for chunk in chunked(lines, str)]


def build_trace(
    prepared: PreparedTurn,
    outcome: ExchangeOutcome,
    *,
    processors: Mapping[str, str],
    model: str,
    stored: Sequence[Turn] = (),
) -> TurnTrace:
    """The trace of a finished exchange from what the engine prepared and measured;
    ``stored``: the turns the exchange stored (the message, the answer), which its texts
    may refer to."""
    ctx = prepared.context
    follow_up = prepared.detection.intent if prepared.detection.intent != "pronoun" else None
    return TurnTrace(
        turn=outcome.turn,
        user_seq=outcome.user_seq,
        answer_seq=outcome.answer_seq,
        created_at=utc_now(),
        typed=ctx.original_message,
        sent=ctx.message,
        follow_up=follow_up if neutralise(ctx.message) != neutralise(ctx.original_message) else None,
        messages=tuple(prepared.messages),
        layers=tuple(
            TraceLayer(
                name=a.name, allocated=a.allocated, used=a.used, items=a.items,
                dropped_seqs=tuple(a.dropped_seqs), truncated=a.truncated,
            )
            for a in ctx.accounts.values()
        ),
        context_window=ctx.input_budget + ctx.reply_reserve,
        input_budget=ctx.input_budget,
        reply_reserve=ctx.reply_reserve,
        total_tokens=ctx.total_tokens,
        exact=ctx.exact,
        counter=ctx.counter,
        strategy=ctx.strategy,
        mode=prepared.mode,
        format=ctx.format,
        locale=ctx.locale,
        needs_context=prepared.detection.needs_context,
        intent=prepared.detection.intent,
        detection_score=round(prepared.detection.score, 4),
        detection_reason=prepared.detection.reason,
        rewrite=_rewrite(ctx, prepared.rewrite),
        recalled=recalled_turns(prepared),
        pins=_pins(ctx, prepared.state.constraints),
        processors=dict(processors),
        model=model,
        prepare_ms=round(prepared.prepare_ms, 3),
        ttft_ms=None if outcome.ttft_ms is None else round(outcome.ttft_ms, 3),
        model_ms=round(outcome.model_ms, 3),
        partial=outcome.partial,
        model_calls=outcome.model_calls,
        stopped=outcome.stopped,
        sources=trace_sources(prepared, stored),
    )
