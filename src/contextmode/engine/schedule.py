"""Step 4 of a turn: the background work it schedules, one unit per session (the job `UNIT`:
emotion, constraints and the summary when due, over every turn since the last unit ran), and
the steps themselves. They run off the response path, on the engine's `JobQueue`; every model
call a job makes is a background call (`models.priority.in_background`): on an endpoint with
few slots, replies go first. A burst of jobs shares one pooled store connection (`JobRunner`),
handed back before a processor that may call a model runs (`TurnParts.let_go_before`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from functools import cache

from ..assembly.agent import as_sentence
from ..errors import ConflictError, ContextWindowExceeded, ModelPreempted, OutputRejected
from ..jobs import StepFailed, report_step
from ..memory.strategies import get_strategy, summary_keeps
from ..models.calls import call_log, model_step
from ..models.priority import in_background
from ..processors.base import (
    ConstraintExtractor,
    ConstraintUpdate,
    EmotionScorer,
    PriorTurn,
    Summarizer,
    extracts_alone,
    fits_a_window,
    scores_in_context,
)
from ..processors.window import usable_tokens
from ..types import Constraint, SessionKey, Summary, Turn, utc_now
from .backlog import Due
from .parts import PendingSummary, TurnParts
from .request import PreparedTurn
from .seams import Processors, safe_with_shared_connection

__all__ = ["EMOTION_CONTEXT_TURNS", "MODEL_TURNS", "UNIT", "schedule_jobs", "summarize_now"]

EMOTION_CONTEXT_TURNS = 20
"""Earlier turns a contextual emotion scorer reads (the offline one's context window)."""


UNIT = "memory"
"""The name of a session's one background job (its unit of work: emotion, constraints, summary)."""

UNIT_PASSES = 4
"""Passes one unit makes over its backlog (turns that came while it ran) before it lets a new
unit take over: the session's job lock and the attempt's time limit stay short."""


def schedule_jobs(parts: TurnParts, key: SessionKey, user_turn: Turn, prepared: PreparedTurn | None) -> list[str]:
    """Schedule the background work a new user turn needs; returns its kinds.

    The turn joins the session's backlog (`Backlog`), and one unit of work per session (the job
    `UNIT`) covers every turn since the last that ran: their emotion, their constraints and the
    summary when one is due. A turn that comes while the session's unit waits or runs merges
    into it (a running unit looks at the backlog again before it ends), so background work never
    piles up behind a conversation faster than the model."""
    jobs = ["emotion", "constraints"]
    parts.backlog.add(key, Due(turn=user_turn, earlier=_loaded_before(prepared, user_turn)))
    upto = _summary_due(parts, user_turn, prepared)
    if upto is not None:
        jobs.append("summary")
        parts.backlog.want_summary(key, upto)
    if not parts.backlog.covering(key):
        parts.jobs.schedule(
            key.tenant, key.session_id, UNIT, lambda: in_background(_run_unit(parts, key)), coalesce=True,
        )
    return jobs


async def _run_unit(parts: TurnParts, key: SessionKey) -> None:
    """The session's unit of background work: passes over its backlog until nothing is left
    (at most `UNIT_PASSES`; then another unit is scheduled for the rest)."""
    backlog = parts.backlog
    backlog.cover(key, True)
    try:
        with model_step("background", session=key.session_id):  # the call log names the session
            for _ in range(UNIT_PASSES):
                await _unit_pass(parts, key)
                if not backlog.has_work(key):
                    return
    finally:
        backlog.cover(key, False)  # no await after the last look: a newer turn schedules a unit
    parts.jobs.schedule(
        key.tenant, key.session_id, UNIT, lambda: in_background(_run_unit(parts, key)), coalesce=True,
    )


async def _unit_pass(parts: TurnParts, key: SessionKey) -> None:
    """One pass: each kind of work over what the backlog holds for it, each step's outcome
    counted under its own name (`report_step`). A step cut short for a reply stops the pass (the
    job tries again later); a step that fails lets the others run, then fails the attempt."""
    failed: list[tuple[str, BaseException]] = []
    behind = parts.backlog.pending(key) > MODEL_TURNS  # the model fell behind the conversation
    for kind, step in _STEPS:
        try:
            ran = await step(parts, key, behind)
        except ModelPreempted:
            raise
        except OutputRejected as exc:
            report_step(kind, ok=False, error=exc.reason[:500], rejected=True)
        except Exception as exc:
            failed.append((kind, exc))
        else:
            if ran:
                report_step(kind, ok=True)
    if failed:
        raise StepFailed(failed)


async def _summary_step(parts: TurnParts, key: SessionKey, behind: bool) -> bool:
    """The summary due, folded by the engine's summariser; when the model fell behind (the pass
    began with more than `MODEL_TURNS` turns waiting) and the summariser is a model's (it says
    what its call costs of the model's window: `LLMSummarizer`, audited or not), by the offline
    one, noted in the call log."""
    upto = parts.backlog.take_summary(key)
    if upto is None:
        return False
    summarizer = parts.processors.summarizer
    filled = behind and fits_a_window(summarizer) and summarizer.call_tokens(None, (), parts.counter) is not None
    try:
        await summarize_now(parts, key, upto=upto or None, summarizer=_offline().summarizer if filled else None)
        if filled:
            call_log().note("summary", key.session_id, "filled in offline: the model fell behind")
    except BaseException as exc:
        if not isinstance(exc, OutputRejected):
            parts.backlog.want_summary(key, upto)
        raise
    return True


MODEL_TURNS = 3
"""Newest turns of a backlog the model's constraint call reads (in one call); the emotion
call scores the newest. Older turns of a backlog are covered by the offline processors."""


async def _score_backlog(parts: TurnParts, key: SessionKey, behind: bool) -> bool:
    """Score the emotion of every turn the session's backlog holds: the newest with the engine's
    scorer, older ones (the model fell behind) with the offline one, noted in the call log."""
    backlog = parts.backlog
    dues = backlog.take(key, "emotion")
    if not dues:
        return False
    try:
        older, newest = dues[:-1], dues[-1]
        if older:
            filled = not safe_with_shared_connection(parts.processors.emotion)  # it calls a model
            for due in older:
                await _score_emotion(parts, key, due.turn, due.earlier, scorer=_offline().emotion if filled else None)
            if filled:
                call_log().note("emotion", key.session_id,
                                f"filled in offline: {len(older)} older turn(s), the model fell behind")
        try:
            await _score_emotion(parts, key, newest.turn, newest.earlier)
        except OutputRejected:  # nothing of the model's is stored; the turn still gets a score
            await _score_emotion(parts, key, newest.turn, newest.earlier, scorer=_offline().emotion)
            call_log().note("emotion", key.session_id, "filled in offline: the model's score was rejected")
            raise
    except BaseException as exc:
        if not isinstance(exc, OutputRejected):  # rejected: nothing stored, no retry
            backlog.put_back(key, "emotion", dues)
        raise
    return True


async def _extract_backlog(parts: TurnParts, key: SessionKey, behind: bool) -> bool:
    """Extract constraints from every turn the session's backlog holds: with a model extractor,
    the newest `MODEL_TURNS` in one call and older ones offline (noted in the call log); with a
    model-free one, turn by turn."""
    backlog = parts.backlog
    dues = backlog.take(key, "constraints")
    if not dues:
        return False
    extractor = parts.processors.extractor
    try:
        if safe_with_shared_connection(extractor) or len(dues) == 1:
            for due in dues:
                await _extract_constraints(parts, key, due.turn)
            return True
        older, newest = dues[:-MODEL_TURNS], dues[-MODEL_TURNS:]
        for due in older:
            await _extract_constraints(parts, key, due.turn, extractor=_offline().extractor)
        if older:
            call_log().note("constraints", key.session_id,
                            f"filled in offline: {len(older)} older turn(s), the model fell behind")
        turns = [d.turn for d in newest]
        merged = replace(turns[-1], content="\n".join(t.content for t in turns),
                         tokens=sum(t.tokens for t in turns))
        await _extract_constraints(parts, key, merged, sources=turns)
    except BaseException as exc:
        if not isinstance(exc, OutputRejected):  # rejected: nothing stored, no retry
            backlog.put_back(key, "constraints", dues)
        raise
    return True


@cache
def _offline() -> Processors:
    return Processors.offline()


_STEPS: tuple[tuple[str, Callable[[TurnParts, SessionKey, bool], Awaitable[bool]]], ...] = (
    ("emotion", _score_backlog),
    ("constraints", _extract_backlog),
    ("summary", _summary_step),
)
"""A unit's steps in order: each takes its part of the backlog (and whether the model fell
behind), returns whether it had any."""


def _summary_due(parts: TurnParts, user_turn: Turn, prepared: PreparedTurn | None) -> int | None:
    """``None`` when no summary is due; else the last turn it must reach (0: the usual range)."""
    strategy = get_strategy(parts.settings.strategy)
    covered = prepared.state.summary_covers_seq if prepared is not None else 0
    # Turns after this one: the user turn and (usually) the answer. Without a
    # prepared state the job itself re-checks the coverage, so over-scheduling is harmless.
    last_seq = user_turn.seq + 1
    keeps = summary_keeps(strategy)
    if prepared is not None and not prepared.context.steady:  # a window that slides: the usual range
        keeps = strategy.recent_turns
    uncovered_outside_window = last_seq - keeps - covered
    # Turns the budget already dropped from the window reach the model in no form
    # until a summary covers them: summarise them now, whatever the threshold.
    account = prepared.context.accounts.get("recent") if prepared is not None else None
    dropped = [seq for seq in (account.dropped_seqs if account is not None else ()) if seq > covered]
    upto = max(dropped, default=0)
    if uncovered_outside_window >= parts.settings.summary_threshold or upto:
        return max(upto, last_seq - keeps) if keeps != summary_keeps(strategy) else upto
    return None


def _loaded_before(prepared: PreparedTurn | None, turn: Turn) -> list[Turn] | None:
    """The `EMOTION_CONTEXT_TURNS` turns before ``turn`` as preparing it loaded them, when it
    loaded every one (no engine notice left out) and nothing was appended in between; else
    ``None`` (the emotion job reads them from the store)."""
    if prepared is None or prepared.state.last_seq != turn.seq - 1:
        return None
    first = max(1, turn.seq - EMOTION_CONTEXT_TURNS)
    loaded = [t for t in prepared.state.turns if first <= t.seq < turn.seq]
    if [t.seq for t in loaded] != list(range(first, turn.seq)):
        return None
    return loaded


async def _score_emotion(
    parts: TurnParts, key: SessionKey, turn: Turn, earlier: list[Turn] | None, *, scorer: EmotionScorer | None = None,
) -> None:
    emotion = scorer or parts.processors.emotion
    if scores_in_context(emotion):
        # The turns just before: the conversation's mood and the speaker's baseline (as the
        # turn loaded them, or read again).
        if earlier is None:
            earlier = await parts.store.turns(
                key, from_seq=max(1, turn.seq - EMOTION_CONTEXT_TURNS),
                to_seq=turn.seq - 1,
            )
        prior = [PriorTurn(text=t.content, same_speaker=t.role == turn.role) for t in earlier]
        await parts.let_go_before(emotion)
        score = await emotion.score_in_context(turn.content, prior)
    else:
        await parts.let_go_before(emotion)
        score = await emotion.score(turn.content)
    await parts.store.set_emotions(key, {turn.seq: max(0.0, min(1.0, score))})


async def _extract_constraints(
    parts: TurnParts, key: SessionKey, turn: Turn, *, extractor: ConstraintExtractor | None = None,
    sources: Sequence[Turn] = (),
) -> None:
    """Pin what ``turn`` states; ``sources``: the turns ``turn`` joins (each pin then names the
    one its quote is from)."""
    from ..processors.constraints import apply_update

    store = parts.store
    extractor = extractor or parts.processors.extractor
    # An extractor that can tell without the stored constraints (the offline one, for a
    # turn that retracts nothing) gives the same update for any of them: a turn stating
    # nothing reads none, and a retry of the compare-and-set does not extract again.
    alone: ConstraintUpdate | None = extractor.extract_alone(turn) if extracts_alone(extractor) else None
    if alone is not None and not alone.upsert and not alone.remove_keys:
        return
    for _ in range(5):  # compare-and-set: retry against a newer version
        state = await store.load(key, recent=0, max_uncovered=0)  # constraints only
        if alone is not None:
            update = alone
        else:
            await parts.let_go_before(extractor)
            update = await extractor.extract(turn, state.constraints)
        if not update.upsert and not update.remove_keys:
            return
        if sources:
            update = replace(update, upsert=tuple(_from_source(c, sources) for c in update.upsert))
        merged = apply_update(state.constraints, update)
        if await store.commit_constraints(
            key, merged, expected_version=state.constraints_version
        ):
            return
    raise ConflictError("constraints kept changing underneath; will retry")


def _from_source(pin: Constraint, sources: Sequence[Turn]) -> Constraint:
    """``pin`` naming the newest of ``sources`` its quote is in (else as it is)."""
    quote = " ".join(pin.quote.split()).casefold()
    for turn in reversed(sources):
        if quote and quote in " ".join(turn.content.split()).casefold():
            return replace(pin, source_seq=turn.seq)
    return pin


async def summarize_now(
    parts: TurnParts, key: SessionKey, *, force: bool = False, upto: int | None = None,
    summarizer: Summarizer | None = None,
) -> bool:
    """Fold the turns outside the recent window into the summary (see `Engine.summarize_now`),
    with ``summarizer`` (default: the engine's).

    A summariser that must fit a model's window (`WindowedSummarizer`) folds them in chunks
    that fit `EngineSettings.context_window`, and each chunk's summary is committed before
    the next one is asked for: a job cut off half-way keeps what it committed, and its retry
    starts after it."""
    store = parts.store
    strategy = get_strategy(parts.settings.strategy)
    info = await store.version(key)
    state = await store.load(key, recent=0, max_uncovered=0)
    previous = state.summary
    start = state.summary_covers_seq + 1
    # Due by count, the summary leaves the strategy's window alone (a steady window's turns
    # are folded in once it drops them); asked for, it folds everything but the recent turns.
    end = info.last_seq - (strategy.recent_turns if force else summary_keeps(strategy))
    if upto is not None:
        # Dropped turns reach the model in no form until summarised: any number is due.
        end, force = max(end, min(upto, info.last_seq)), True
    due = end - start + 1
    if due <= 0 or (due < parts.settings.summary_threshold and not force):
        return False
    folding = _Folding(parts=parts, key=key, end=end, summarizer=summarizer or parts.processors.summarizer)
    committed = False
    # An attempt cut off (job timeout) after the summariser answered keeps its result
    # here; the retry commits it instead of paying for the same range twice.
    pending = parts.pending_summaries
    while start <= end:
        expected = previous.version if previous else 0
        kept = pending.take(key)
        if kept is not None and (kept.expected_version, kept.first_seq, kept.session_created) == (
            expected, start, info.created_at
        ):
            summary: Summary | None = kept.summary
        else:
            summary = await folding.next_summary(previous, start)
        if summary is None:
            return committed
        pending.keep(key, PendingSummary(expected_version=expected, first_seq=start,
                                         session_created=info.created_at, summary=summary))
        committed = await store.commit_summary(key, summary, expected_version=expected)
        pending.take(key)
        if not committed:
            return False
        previous, start = replace(summary, version=expected + 1), summary.covers_seq + 1
    return committed


@dataclass
class _Folding:
    """One summary job's walk over its due turns (read once), a chunk per model call."""

    parts: TurnParts
    key: SessionKey
    end: int
    summarizer: Summarizer
    turns: Sequence[Turn] | None = None

    async def next_summary(self, previous: Summary | None, start: int) -> Summary | None:
        """``previous`` with the next chunk of turns from ``start`` folded in; ``None``: no turns."""
        parts = self.parts
        if self.turns is None:
            self.turns = await parts.store.turns(self.key, from_seq=start, to_seq=self.end)
        pending = [t for t in self.turns if t.seq >= start]
        if not pending:
            return None
        covers, remembered = _next_chunk(parts, previous, pending, self.summarizer)
        if remembered:
            await parts.let_go_before(self.summarizer)
            text = (await self.summarizer.summarize(previous, remembered)).text
        else:
            text = previous.text if previous else ""
        return Summary(text=text, covers_seq=covers, tokens=parts.counter.count(text), created_at=utc_now())


def _next_chunk(
    parts: TurnParts, previous: Summary | None, pending: Sequence[Turn], summarizer: Summarizer
) -> tuple[int, list[Turn]]:
    """The last turn the next summary covers and the turns its call is given: all of ``pending``,
    or for a `WindowedSummarizer` the most that fit the window (at least one, cut to fit).

    Engine notices are never summarised; the summary still covers their seqs. Tool calls
    and results are summarised as sentences, never raw JSON."""
    remembered = [as_sentence(t) for t in pending if not t.notice]
    if not remembered or not fits_a_window(summarizer):
        return pending[-1].seq, remembered
    limit = usable_tokens(parts.settings.context_window)

    def cost(turns: Sequence[Turn]) -> int:
        # None: no window to fit after all (an `AuditedSummarizer` around the offline one)
        return summarizer.call_tokens(previous, turns, parts.counter) or 0

    if cost(remembered) <= limit:
        return pending[-1].seq, remembered
    low, high = 0, len(remembered) - 1  # the longest prefix that fits (all of them does not)
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if cost(remembered[:mid]) <= limit else (low, mid - 1)
    if low == 0:
        return remembered[0].seq, [_cut_to_fit(parts, remembered[0], cost, limit)]
    return remembered[low - 1].seq, remembered[:low]


def _cut_to_fit(parts: TurnParts, turn: Turn, cost: Callable[[Sequence[Turn]], int], limit: int) -> Turn:
    """``turn`` with its text cut (the start kept, "…" marking the cut) so one call fits ``limit``."""
    def cut(chars: int) -> Turn:
        return replace(turn, content=turn.content[:chars].rstrip() + "…")

    if cost([cut(0)]) > limit:
        raise ContextWindowExceeded(
            f"the summary call takes {cost([cut(0)])} tokens (its max_tokens included) with no turn in it, "
            f"more than the {limit} usable of the {parts.settings.context_window}-token context window: "
            "raise CONTEXTMODE_CONTEXT_WINDOW or lower CONTEXTMODE_LLM_SUMMARY_MAX_TOKENS"
        )
    low, high = 0, len(turn.content)
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if cost([cut(mid)]) <= limit else (low, mid - 1)
    return cut(low)
