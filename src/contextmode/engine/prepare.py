"""Step 1 of a turn: load the session, detect a follow-up, rewrite, recall, assemble.

Writes nothing and calls no answer model; the result (`PreparedTurn`) is what
`stream.py` sends. Each function here is one step of `prepare_turn`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from functools import partial
from typing import cast

from ..assembly import Context, CurrentTurn, assemble, cut_to_tokens, to_messages
from ..errors import MessageTooLarge, NoPreviousAnswer
from ..memory.strategies import Strategy, get_strategy
from ..models.priority import response_budget
from ..processors.base import Detection, IntentKind, Rewrite
from ..processors.intents import build_follow_up_prompt
from ..processors.verify import verified
from ..settings import Mode
from ..text.dates import named_day
from ..text.lang import is_chinese
from ..types import SessionKey, SessionState, Turn, utc_now
from .followup import TEMPLATE_INTENTS, answered_before, follow_up_context
from .parts import TurnParts
from .request import PreparedTurn, TurnRequest
from .seams import recall_limit

__all__ = ["load_state", "prepare_turn"]


@dataclass(frozen=True, kw_only=True, slots=True)
class _Rewritten:
    current: str
    """The message the answer is built around (a follow-up template, or the message)."""
    rewrite: Rewrite | None
    rejected: Rewrite | None
    quotes: Turn | None = None
    """The answer a follow-up template quotes whole (sent once, inside the template)."""

    @property
    def verified_text(self) -> str | None:
        r = self.rewrite
        return r.text if r is not None and r.changed and r.verified else None


async def load_state(parts: TurnParts, key: SessionKey, strategy: Strategy) -> SessionState:
    """The session state the strategy needs (O(window)); two turns more than its window, so the
    window can reach back to the question its oldest answer replies to."""
    return await parts.store.load(
        key, recent=strategy.recent_turns + 2, key_moments=strategy.key_moment_limit
    )


async def prepare_turn(parts: TurnParts, request: TurnRequest) -> PreparedTurn:
    """Load, detect, rewrite and assemble, without writing anything or calling the answer model.

    The store calls share one pooled connection (`Engine.one_connection`; the caller's scope
    when it has one), handed back before a processor or recaller that may call a model runs."""
    async with parts.one_connection():
        return await _prepare(parts, request)


async def _prepare(parts: TurnParts, request: TurnRequest) -> PreparedTurn:
    started = time.perf_counter()
    message = request.text()
    mode: Mode = request.mode or parts.settings.mode
    chosen = get_strategy(request.strategy or parts.settings.strategy)
    # Engine notices (the offline responder's text) describe a request instead of
    # answering it: they never feed memory, the rewrite or the model's history.
    raw = await load_state(parts, request.key, chosen)
    retried = unanswered_repeat(raw.turns, request)
    if retried is not None:  # a retry of a failed request: its stored turn is this turn's
        raw = replace(raw, turns=raw.turns[:-1])
    state = without_notices(raw)
    # Tool results (often huge JSON) are no antecedents for a pronoun either.
    history = [t for t in state.turns if t.role != "tool"]
    detection = Detection(needs_context=False)
    settings = parts.settings
    # Detection and rewriting share one budget relative to the session's replies (engine/pace.py).
    with response_budget(parts.pace.budget(request.key, share=settings.response_share,
                                           minimum=settings.response_min_s)):
        if history:
            await parts.let_go_before(parts.processors.detector)
            detection = await parts.processors.detector.detect(message, history)
        if detection.intent in TEMPLATE_INTENTS:
            step = _template_step(parts, raw, state, message, detection)
        else:
            step = await _rewrite_step(parts, state, message, detection, chosen)
    current = step.current
    if mode == "decoupled" and step.verified_text is not None:
        current = step.verified_text
    # A template quotes the last answer whole: recall looks for what it is about, not for the
    # template's own words.
    query = f"{message}\n{step.quotes.content}" if step.quotes is not None else step.verified_text or current
    state = await _recall_step(parts, state, query, chosen)
    if recall_limit(chosen):
        state = await _dated_step(parts, request.key, state, message, request.now or utc_now())
    context = _assemble_step(parts, request, state, current, step, mode, chosen)
    if mode != "decoupled" and recall_limit(chosen) and _idle(context, state):
        state = await _load_more(parts, request.key, state, context, chosen)
        context = _assemble_step(parts, request, state, current, step, mode, chosen)
    return PreparedTurn(
        state=state,
        detection=detection,
        rewrite=step.rewrite,
        rejected_rewrite=step.rejected,
        context=context,
        messages=to_messages(context),
        mode=mode,
        prepare_ms=(time.perf_counter() - started) * 1000,
        retried=retried,
    )


def unanswered_repeat(turns: Sequence[Turn], request: TurnRequest) -> Turn | None:
    """The session's last turn when ``request`` repeats it: a user turn with the same text, never
    answered, stored less than ``request.retry_window_s`` seconds ago (a client retrying a failed
    request); else ``None``."""
    if request.retry_window_s <= 0 or not turns:
        return None
    last = turns[-1]
    if last.role != "user" or last.content != request.message:
        return None
    age = ((request.now or utc_now()) - last.created_at).total_seconds()
    return last if 0 <= age < request.retry_window_s else None


async def _rewrite_step(
    parts: TurnParts, state: SessionState, message: str, detection: Detection, strategy: Strategy
) -> _Rewritten:
    """The rewriter's output goes through the verifier (a rewrite is a hint until it accepts it)."""
    if not (detection.needs_context and parts.settings.rewrite and state.turns):
        return _Rewritten(current=message, rewrite=None, rejected=None)
    recent = [t for t in state.turns if t.role != "tool"][-max(strategy.recent_turns, 4):]
    summary = state.summary.text if state.summary else None
    await parts.let_go_before(parts.processors.rewriter)
    rewrite, rejected = await verified(parts.processors.rewriter, message, recent, summary=summary)
    return _Rewritten(current=message, rewrite=rewrite, rejected=rejected)


def _answer_turn(state: SessionState) -> Turn | None:
    """The stored turn holding the session's last answer (the newest assistant turn with it)."""
    for turn in reversed(state.turns):
        if turn.role == "assistant" and turn.content == state.last_answer:
            return turn
    return None


def _template_step(
    parts: TurnParts, raw: SessionState, state: SessionState, message: str, detection: Detection
) -> _Rewritten:
    """A follow-up intent answered by its template over the last real exchange (the
    conversation for a summary; `followup.py`). Refused (`NoPreviousAnswer`) only while
    nothing in the session was ever answered."""
    intent = cast("IntentKind", detection.intent)
    locale = parts.settings.locale
    lang = locale if locale != "auto" else ("zh" if is_chinese(message) else "en")
    source = follow_up_context(state, intent, lang) if answered_before(raw) else None
    if source is None:
        raise NoPreviousAnswer(intent)
    quotes = _answer_turn(state) if source == state.last_answer else None
    return _Rewritten(current=_follow_up_prompt(parts, intent, source, message, lang), rewrite=None, rejected=None,
                      quotes=quotes)


def _follow_up_prompt(parts: TurnParts, intent: IntentKind, source: str, message: str, lang: str) -> str:
    # Keep the template inside half the input budget: the last answer may be long
    # (its end is kept: for a conversation, the newest turns).
    limit = parts.budget().input_tokens // 2
    count = parts.counter.count
    prompt = build_follow_up_prompt(intent, source, message, locale=lang)
    if count(prompt) > limit:
        head = count(prompt) - count(source)
        trimmed = cut_to_tokens(source, max(1, limit - head), count)
        prompt = build_follow_up_prompt(intent, trimmed, message, locale=lang)
    return prompt


async def _recall_step(parts: TurnParts, state: SessionState, query: str, strategy: Strategy) -> SessionState:
    """``state`` with the older turns the recaller finds for ``query`` (strategies with a recall layer)."""
    limit = recall_limit(strategy)
    if parts.recaller is None or not limit:
        return state
    await parts.let_go_before(parts.recaller)
    recalled = await parts.recaller.recall(
        parts.store, state, query, limit=limit, recent_turns=strategy.recent_turns
    )
    return replace(state, recalled=tuple(t for t in recalled if not t.notice))


_DAY_TURNS = 64
"""At most this many turns of a day a question names come first in recall."""


async def _dated_step(parts: TurnParts, key: SessionKey, state: SessionState, message: str, now: datetime) -> SessionState:
    """A question that names a day ("我5月2日的心情怎么样？", "What did I say last Tuesday?")
    recalls that day's turns first, whatever words they use (`text.dates.named_day`, read
    against the question's time). The day is found by a binary search over the log's dates:
    O(log history) one-turn reads, only for such a question."""
    day = named_day(message, now)
    if day is None or state.last_seq < 1:
        return state
    zone = now.tzinfo

    def on_or_after(turn: Turn) -> bool:
        return turn.created_at.astimezone(zone).date() >= day

    lo, hi = 1, state.last_seq + 1
    while lo < hi:
        mid = (lo + hi) // 2
        probe = await parts.store.turns(key, from_seq=mid, to_seq=mid)
        if not probe or on_or_after(probe[0]):
            hi = mid
        else:
            lo = mid + 1
    if lo > state.last_seq:
        return state
    found = await parts.store.turns(key, from_seq=lo, to_seq=min(state.last_seq, lo + _DAY_TURNS - 1))
    days = [t for t in found if t.created_at.astimezone(zone).date() == day and not t.notice and t.role != "tool"]
    if not days:
        return state
    # That day's turns recall ranked first (in its order), then the day's others (the user's own
    # words first: what they said, felt, did), then everything else recall found.
    on_day = {t.seq: t for t in days}
    ranked = [t for t in state.recalled if t.seq in on_day]
    ranked_seqs = {t.seq for t in ranked}
    rest = sorted((t for t in days if t.seq not in ranked_seqs), key=lambda t: (t.role != "user", t.seq))
    return replace(state, recalled=(*ranked, *rest, *(t for t in state.recalled if t.seq not in on_day)))


def _assemble_step(
    parts: TurnParts, request: TurnRequest, state: SessionState, current: str, step: _Rewritten, mode: Mode,
    strategy: Strategy,
) -> Context:
    message = request.text()
    assembled = state
    if mode == "decoupled":
        # Decoupled mode: memory only feeds the rewrite; the answer sees the standalone
        # question and the pinned constraints, never the raw history. Without a verified
        # rewrite it sees the user's message and the last exchange.
        last = () if current != message else last_exchange(state.turns)
        assembled = replace(state, turns=last, summary=None, key_moments=(), recalled=())
    rewritten = CurrentTurn(
        standalone=current if current != message else None,
        hint=step.verified_text if mode != "decoupled" and current == message else None,
        quotes=step.quotes.seq if step.quotes is not None and current != message else None,
    )
    build = partial(assemble, assembled, message, counter=parts.counter, strategy=strategy,
                    budget=parts.budget(), config=parts.assembly_config(request.system_prompt), now=request.now)
    try:
        return build(current=rewritten)
    except MessageTooLarge:
        if rewritten == CurrentTurn():
            raise
    # The rewrite (or its hint, or the follow-up prompt around the last answer) made the turn
    # too large where the user's own words fit: send those, as when nothing was rewritten.
    return build()


_IDLE_TOKENS = 16
"""Unused input tokens below which an assembly is taken as full (a turn costs more)."""


def _idle(context: Context, state: SessionState) -> bool:
    """True when budget is left unused while older turns were not even loaded."""
    return (context.input_budget - context.total_tokens > _IDLE_TOKENS and bool(state.turns)
            and state.turns[0].seq > 1)


async def _load_more(
    parts: TurnParts, key: SessionKey, state: SessionState, context: Context, strategy: Strategy
) -> SessionState:
    """``state`` with older turns loaded for the budget an assembly left unused (the recent
    window grows back over them, or they come as recall lines; `MemoryPlan.backfill`). At most
    one turn per four idle tokens: the read stays bounded by the budget, not the history."""
    idle = context.input_budget - context.total_tokens
    wanted = len(state.turns) + idle // 4 + _IDLE_TOKENS
    more = await parts.store.load(key, recent=max(wanted, strategy.recent_turns),
                                   max_uncovered=wanted)
    last = state.turns[-1].seq  # nothing newer than what the turn loaded (a retried message is this turn's)
    return replace(state, turns=tuple(t for t in without_notices(more).turns if t.seq <= last))


def without_notices(state: SessionState) -> SessionState:
    """``state`` without engine notices in its turns, key moments and recalled turns
    (and no notice as the last answer a follow-up template is built on)."""
    last_answer = state.last_answer
    answers = [t for t in state.turns if t.role == "assistant"]
    if answers and answers[-1].notice:
        kept = [t for t in answers if not t.notice]
        last_answer = kept[-1].content if kept else None
    return replace(
        state,
        last_answer=last_answer,
        turns=tuple(t for t in state.turns if not t.notice),
        key_moments=tuple(t for t in state.key_moments if not t.notice),
        recalled=tuple(t for t in state.recalled if not t.notice),
    )


def last_exchange(turns: Sequence[Turn]) -> tuple[Turn, ...]:
    """The newest user turn and the answer after it (decoupled mode without a verified rewrite)."""
    users = [i for i, t in enumerate(turns) if t.role == "user"]
    return tuple(turns[users[-1]:]) if users else tuple(turns[-1:])
