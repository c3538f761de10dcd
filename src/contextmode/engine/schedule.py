"""Step 4 of a turn: the background jobs it schedules (emotion, constraints, summary), and
the jobs themselves. They run off the response path, on the engine's `JobQueue`; every model
call a job makes is a background call (`models.priority.in_background`): on an endpoint with
few slots, replies go first."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..assembly.agent import as_sentence
from ..errors import ConflictError
from ..memory.strategies import get_strategy
from ..models.priority import in_background
from ..processors.base import ContextualEmotionScorer, PriorTurn
from ..types import SessionKey, Summary, Turn, utc_now
from .request import PreparedTurn

if TYPE_CHECKING:
    from .core import Engine

__all__ = ["EMOTION_CONTEXT_TURNS", "schedule_jobs", "summarize_now"]

EMOTION_CONTEXT_TURNS = 20
"""Earlier turns a contextual emotion scorer reads (the offline one's context window)."""


def schedule_jobs(engine: Engine, key: SessionKey, user_turn: Turn, prepared: PreparedTurn | None) -> list[str]:
    """Schedule the jobs a new user turn needs; returns their names."""
    tenant, session_id = key.tenant, key.session_id
    jobs = ["emotion", "constraints"]
    earlier = _loaded_before(prepared, user_turn)
    engine.jobs.schedule(
        tenant, session_id, "emotion", lambda: in_background(_score_emotion(engine, key, user_turn, earlier))
    )
    engine.jobs.schedule(tenant, session_id, "constraints",
                         lambda: in_background(_extract_constraints(engine, key, user_turn)))
    upto = _summary_due(engine, user_turn, prepared)
    if upto is not None:
        jobs.append("summary")
        engine.jobs.schedule(
            tenant, session_id, "summary",
            lambda: in_background(summarize_now(engine, key, upto=upto or None)),
            coalesce=True,
        )
    return jobs


def _summary_due(engine: Engine, user_turn: Turn, prepared: PreparedTurn | None) -> int | None:
    """``None`` when no summary is due; else the last turn it must reach (0: the usual range)."""
    strategy = get_strategy(engine.settings.strategy)
    covered = prepared.state.summary_covers_seq if prepared is not None else 0
    # Turns after this one: the user turn and (usually) the answer. Without a
    # prepared state the job itself re-checks the coverage, so over-scheduling is harmless.
    last_seq = user_turn.seq + 1
    uncovered_outside_window = last_seq - strategy.recent_turns - covered
    # Turns the budget already dropped from the window reach the model in no form
    # until a summary covers them: summarise them now, whatever the threshold.
    account = prepared.context.accounts.get("recent") if prepared is not None else None
    dropped = [seq for seq in (account.dropped_seqs if account is not None else ()) if seq > covered]
    upto = max(dropped, default=0)
    if uncovered_outside_window >= engine.settings.summary_threshold or upto:
        return upto
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


async def _score_emotion(engine: Engine, key: SessionKey, turn: Turn, earlier: list[Turn] | None) -> None:
    emotion = engine.processors.emotion
    if isinstance(emotion, ContextualEmotionScorer):
        # The turns just before: the conversation's mood and the speaker's baseline (as the
        # turn loaded them, or read again).
        if earlier is None:
            earlier = await engine.store.turns(
                key.tenant, key.session_id, from_seq=max(1, turn.seq - EMOTION_CONTEXT_TURNS),
                to_seq=turn.seq - 1,
            )
        prior = [PriorTurn(text=t.content, same_speaker=t.role == turn.role) for t in earlier]
        score = await emotion.score_in_context(turn.content, prior)
    else:
        score = await emotion.score(turn.content)
    await engine.store.set_emotions(key.tenant, key.session_id, {turn.seq: max(0.0, min(1.0, score))})


async def _extract_constraints(engine: Engine, key: SessionKey, turn: Turn) -> None:
    from ..processors.constraints import apply_update

    store = engine.store
    for _ in range(5):  # compare-and-set: retry against a newer version
        state = await store.load(key.tenant, key.session_id, recent=0, max_uncovered=0)  # constraints only
        update = await engine.processors.extractor.extract(turn, state.constraints)
        if not update.upsert and not update.remove_keys:
            return
        merged = apply_update(state.constraints, update)
        if await store.commit_constraints(
            key.tenant, key.session_id, merged, expected_version=state.constraints_version
        ):
            return
    raise ConflictError("constraints kept changing underneath; will retry")


async def summarize_now(engine: Engine, key: SessionKey, *, force: bool = False, upto: int | None = None) -> bool:
    """Fold the turns outside the recent window into the summary (see `Engine.summarize_now`)."""
    tenant, session_id = key.tenant, key.session_id
    store = engine.store
    strategy = get_strategy(engine.settings.strategy)
    info = await store.version(tenant, session_id)
    state = await store.load(tenant, session_id, recent=0, max_uncovered=0)
    previous = state.summary
    start = state.summary_covers_seq + 1
    end = info.last_seq - strategy.recent_turns
    if upto is not None:
        # Dropped turns reach the model in no form until summarised: any number is due.
        end, force = max(end, min(upto, info.last_seq)), True
    due = end - start + 1
    if due <= 0 or (due < engine.settings.summary_threshold and not force):
        return False
    expected = previous.version if previous else 0
    # An attempt cut off (job timeout) after the summariser answered keeps its result
    # here; the retry commits it instead of paying for the same range twice.
    uncommitted = engine._uncommitted
    kept = uncommitted.pop((tenant, session_id), None)
    if kept is not None and kept[:3] == (expected, start, info.created_at):
        summary = kept[3]
    else:
        turns = await store.turns(tenant, session_id, from_seq=start, to_seq=end)
        if not turns:
            return False
        # Engine notices are never summarised; the summary still covers their seqs.
        # Tool calls and results are summarised as sentences, never raw JSON.
        remembered = [as_sentence(t) for t in turns if not t.notice]
        if remembered:
            text = (await engine.processors.summarizer.summarize(previous, remembered)).text
        else:
            text = previous.text if previous else ""
        summary = Summary(text=text, covers_seq=turns[-1].seq, tokens=engine.counter.count(text), created_at=utc_now())
    if len(uncommitted) >= 1024:
        uncommitted.clear()
    uncommitted[(tenant, session_id)] = (expected, start, info.created_at, summary)
    committed = await store.commit_summary(tenant, session_id, summary, expected_version=expected)
    uncommitted.pop((tenant, session_id), None)
    return committed
