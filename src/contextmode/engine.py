"""The engine: one chat turn, end to end.

load → detect a follow-up → rewrite when needed → assemble → stream the answer
→ persist → schedule background jobs. The user turn is stored before the model
is called; the answer after, marked partial if the stream broke, in a
``finally`` that cancellation cannot skip (seed 000). Summaries, constraint
extraction and emotion scoring run afterwards, never on the response path.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal

from .assembly import AssemblyConfig, Context, assemble, cut_to_tokens, to_messages
from .errors import ModelError, NoPreviousAnswer
from .jobs import JobRunner, JobSettings
from .memory.budget import Budget
from .memory.strategies import Strategy, get_strategy
from .models.base import ChatModel
from .models.offline import OfflineResponder
from .processors.base import (
    ConstraintExtractor,
    ContextDetector,
    Detection,
    EmotionScorer,
    Rewrite,
    Rewriter,
    Summarizer,
)
from .processors.intents import build_follow_up_prompt
from .settings import EngineSettings, Mode
from .store.base import Store
from .tokens.base import TokenCounter
from .types import ChatMessage, NewTurn, SessionState, Summary, Turn, utc_now, validate_id

__all__ = ["Engine", "PreparedTurn", "TurnEvent", "TurnResult"]

log = logging.getLogger("contextmode.turn")

_TEMPLATE_INTENTS = frozenset({"detail", "simplify", "example", "summary"})
"""Seed 000 intents answered from the last answer; a pronoun goes through the rewriter instead."""


@dataclass(frozen=True, kw_only=True)
class PreparedTurn:
    """Everything decided before the model is called (nothing written yet)."""

    state: SessionState
    """The loaded session."""
    detection: Detection
    rewrite: Rewrite | None
    """The standalone question, when the message needed context and was rewritten."""
    context: Context
    """Exactly what the model receives, with per-layer accounting."""
    messages: Sequence[ChatMessage]
    """``context`` as chat messages (what is sent)."""
    mode: Mode
    prepare_ms: float
    """Time spent loading, detecting, rewriting and assembling, milliseconds."""


@dataclass(frozen=True, kw_only=True)
class TurnEvent:
    """One event of a streamed turn."""

    kind: Literal["prepared", "delta", "done"]
    text: str = ""
    """The answer's text delta (``delta``) or the whole answer (``done``)."""
    prepared: PreparedTurn | None = None
    """Set on ``prepared``."""
    result: TurnResult | None = None
    """Set on ``done``."""


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


class Engine:
    """A chat turn with memory. Every collaborator is a seam with an offline default."""

    def __init__(
        self,
        *,
        store: Store,
        model: ChatModel,
        counter: TokenCounter,
        detector: ContextDetector,
        rewriter: Rewriter,
        summarizer: Summarizer,
        extractor: ConstraintExtractor,
        emotion: EmotionScorer,
        settings: EngineSettings | None = None,
        recaller: Any | None = None,
        jobs: JobRunner | None = None,
        system_prompt: str | None = None,
    ) -> None:
        self.store = store
        self.model = model
        self.counter = counter
        self.detector = detector
        self.rewriter = rewriter
        self.summarizer = summarizer
        self.extractor = extractor
        self.emotion = emotion
        self.settings = settings or EngineSettings()
        self.recaller = recaller
        self.system_prompt = system_prompt
        self._uncommitted: dict[tuple[str, str], tuple[int, int, Any, Any]] = {}
        """Summaries computed but not committed, by session: (expected version, first seq,
        session creation time, summary)."""
        self.jobs: JobRunner = jobs or JobRunner(
            store, replace(JobSettings.from_env(), attempts=self.settings.job_attempts)
        )

    # -- preparing -------------------------------------------------------

    def _budget(self) -> Budget:
        return Budget(context_window=self.settings.context_window, reply_reserve=self.settings.reply_reserve)

    def _config(self) -> AssemblyConfig:
        return AssemblyConfig(
            order=self.settings.order,  # type: ignore[arg-type]
            locale=self.settings.locale,
            system_prompt=self.system_prompt,
        )

    async def load(self, tenant: str, session_id: str, strategy: Strategy) -> SessionState:
        """The session state the strategy needs (O(window))."""
        return await self.store.load(
            tenant,
            session_id,
            recent=strategy.recent_turns,
            key_moments=strategy.key_moment_limit,
        )

    async def prepare(
        self,
        tenant: str,
        session_id: str,
        message: str,
        *,
        mode: Mode | None = None,
        strategy: str | Strategy | None = None,
        now: datetime | None = None,
    ) -> PreparedTurn:
        """Load, detect, rewrite and assemble, without writing anything or calling the answer model."""
        started = time.perf_counter()
        validate_id(tenant, "tenant")
        validate_id(session_id)
        mode = mode or self.settings.mode
        chosen = get_strategy(strategy or self.settings.strategy)
        state = await self.load(tenant, session_id, chosen)
        # The offline responder's text describes a request instead of answering it: it must
        # not become the entity a pronoun is resolved to.
        history = [t for t in state.turns if not t.metadata.get("offline")]
        detection = await self.detector.detect(message, history) if history else Detection(needs_context=False)
        current = message
        rewrite: Rewrite | None = None
        if detection.intent in _TEMPLATE_INTENTS:
            if not state.last_answer:
                raise NoPreviousAnswer(detection.intent or "follow-up")
            current = self._follow_up_prompt(detection, state.last_answer, message)
        elif detection.needs_context and self.settings.rewrite and history:
            recent = history[-max(chosen.recent_turns, 4):]
            summary = state.summary.text if state.summary else None
            rewrite = await self.rewriter.rewrite(message, recent, summary=summary)
            if rewrite.changed:
                current = rewrite.text
        recall_limit = int(getattr(chosen, "recall_limit", 0) or 0)
        if self.recaller is not None and recall_limit:
            recalled = await self.recaller.recall(
                self.store, state, current, limit=recall_limit, recent_turns=chosen.recent_turns
            )
            state = replace(state, recalled=tuple(recalled))
        assembled_state = state
        if mode == "decoupled":
            # Seed 002: memory only feeds the rewrite; the answer sees the standalone
            # question and the pinned constraints, never the raw history.
            assembled_state = replace(state, turns=(), summary=None, key_moments=(), recalled=())
        context = assemble(
            assembled_state,
            message,
            counter=self.counter,
            strategy=chosen,
            budget=self._budget(),
            config=self._config(),
            now=now,
            standalone=current if current != message else None,
        )
        return PreparedTurn(
            state=state,
            detection=detection,
            rewrite=rewrite,
            context=context,
            messages=to_messages(context),
            mode=mode,
            prepare_ms=(time.perf_counter() - started) * 1000,
        )

    def _follow_up_prompt(self, detection: Detection, last_answer: str, message: str) -> str:
        # Keep the template inside half the input budget: the last answer may be long.
        limit = self._budget().input_tokens // 2
        prompt = build_follow_up_prompt(detection.intent, last_answer, message)  # type: ignore[arg-type]
        if self.counter.count(prompt) > limit:
            head = self.counter.count(prompt) - self.counter.count(last_answer)
            trimmed = cut_to_tokens(last_answer, max(1, limit - head), self.counter.count)
            prompt = build_follow_up_prompt(detection.intent, trimmed, message)  # type: ignore[arg-type]
        return prompt

    # -- the turn --------------------------------------------------------

    async def stream(
        self,
        tenant: str,
        session_id: str,
        message: str,
        *,
        mode: Mode | None = None,
        strategy: str | Strategy | None = None,
        metadata: dict[str, Any] | None = None,
        user_id: str | None = None,
    ) -> AsyncIterator[TurnEvent]:
        """Run one turn, yielding ``prepared``, then ``delta`` events, then ``done``.

        ``user_id`` names the session's user (stored with the session by the
        first message that gives one; see docs/lifecycle.md).

        The user turn is stored before the model is called. The answer is
        stored in a ``finally`` shielded from cancellation, marked ``partial``
        when the stream broke or the client went away; a `ModelError` is
        re-raised after the partial answer is safe.
        """
        started = time.perf_counter()
        prepared = await self.prepare(tenant, session_id, message, mode=mode, strategy=strategy)
        yield TurnEvent(kind="prepared", prepared=prepared)
        meta: dict[str, Any] = dict(metadata or {})
        if prepared.rewrite is not None and prepared.rewrite.changed:
            meta["rewrite"] = prepared.rewrite.text
        if prepared.detection.intent:
            meta["intent"] = prepared.detection.intent
        user_turn = (
            await self.store.append(
                tenant,
                session_id,
                [NewTurn(role="user", content=message, tokens=self.counter.count(message), metadata=meta)],
                user_id=user_id,
            )
        )[0]
        self._observe(tenant, session_id, [user_turn])
        pieces: list[str] = []
        ttft: float | None = None
        error: ModelError | None = None
        completed = False
        model_started = time.perf_counter()
        try:
            async for delta in self.model.stream(prepared.messages):
                if ttft is None:
                    ttft = (time.perf_counter() - started) * 1000
                pieces.append(delta)
                yield TurnEvent(kind="delta", text=delta)
            completed = True
        except ModelError as exc:
            error = exc
        finally:
            answer = "".join(pieces)
            partial = not completed
            assistant_turn = await asyncio.shield(
                self._finish(tenant, session_id, user_turn, answer, partial, prepared)
            )
            jobs = self._schedule_jobs(tenant, session_id, user_turn, prepared)
            model_ms = (time.perf_counter() - model_started) * 1000
            self._log_turn(prepared, user_turn, ttft, model_ms, partial, jobs)
        if error is not None:
            raise error
        result = TurnResult(
            answer=answer,
            partial=partial,
            user_turn=user_turn,
            assistant_turn=assistant_turn,
            prepared=prepared,
            jobs=jobs,
            ttft_ms=ttft,
            model_ms=model_ms,
        )
        yield TurnEvent(kind="done", text=answer, result=result)

    async def turn(self, tenant: str, session_id: str, message: str, **kwargs: Any) -> TurnResult:
        """Run one turn and return the whole answer."""
        result: TurnResult | None = None
        async for event in self.stream(tenant, session_id, message, **kwargs):
            if event.kind == "done":
                result = event.result
        assert result is not None
        return result

    async def _finish(
        self, tenant: str, session_id: str, user_turn: Turn, answer: str, partial: bool, prepared: PreparedTurn
    ) -> Turn | None:
        if not answer and partial:
            return None  # nothing arrived: the user turn stays, no empty answer is stored
        meta: dict[str, Any] = {"reply_to": user_turn.seq, "model": self.model.name}
        if partial:
            meta["partial"] = True
        if isinstance(self.model, OfflineResponder):
            meta["offline"] = True  # a description of the request, not an answer
        stored = await self.store.append(
            tenant,
            session_id,
            [NewTurn(role="assistant", content=answer, tokens=self.counter.count(answer), metadata=meta)],
        )
        self._observe(tenant, session_id, stored)
        return stored[0]

    # -- background work -------------------------------------------------

    async def record(
        self, tenant: str, session_id: str, role: Literal["user", "assistant"], content: str,
        *, metadata: dict[str, Any] | None = None, user_id: str | None = None,
    ) -> Turn:
        """Append one turn without calling the model (imports, replays) and schedule the
        same background jobs a live turn would."""
        turn = (
            await self.store.append(
                tenant, session_id,
                [NewTurn(role=role, content=content, tokens=self.counter.count(content), metadata=metadata or {})],
                user_id=user_id,
            )
        )[0]
        self._observe(tenant, session_id, [turn])
        if role == "user":
            self._schedule_jobs(tenant, session_id, turn, None)
        return turn

    def cached_sessions(self) -> set[tuple[str, str]]:
        """Sessions this process holds anything of in memory (recall index, pending summary, jobs)."""
        held = {key for key in self._uncommitted}
        if self.recaller is not None and hasattr(self.recaller, "cached_sessions"):
            held.update(self.recaller.cached_sessions())
        held.update(self.jobs.sessions())
        return held

    def forget_local(self, tenant: str, session_id: str) -> dict[str, int]:
        """Drop everything this process holds of the session (its data is being erased).

        Returns counts: ``recall_cache`` (indexes dropped), ``pending_jobs``
        (jobs cancelled) and ``summary_cache`` (computed, uncommitted summaries).
        """
        dropped_index = 0
        if self.recaller is not None and hasattr(self.recaller, "forget"):
            dropped_index = int(bool(self.recaller.forget(tenant, session_id)))
        return {
            "recall_cache": dropped_index,
            "pending_jobs": self.jobs.cancel(tenant, session_id),
            "summary_cache": int(self._uncommitted.pop((tenant, session_id), None) is not None),
        }

    def _observe(self, tenant: str, session_id: str, turns: Sequence[Turn]) -> None:
        """Keep the recall index current: O(new turns), never a re-index."""
        if self.recaller is not None and hasattr(self.recaller, "observe"):
            self.recaller.observe(tenant, session_id, turns)

    def _schedule_jobs(
        self, tenant: str, session_id: str, user_turn: Turn, prepared: PreparedTurn | None
    ) -> list[str]:
        jobs = ["emotion", "constraints"]
        self.jobs.schedule(tenant, session_id, "emotion", lambda: self._score_emotion(tenant, session_id, user_turn))
        self.jobs.schedule(
            tenant, session_id, "constraints", lambda: self._extract_constraints(tenant, session_id, user_turn)
        )
        strategy = get_strategy(self.settings.strategy)
        covered = prepared.state.summary_covers_seq if prepared is not None else 0
        # Turns after this one: the user turn and (usually) the answer. Without a
        # prepared state the job itself re-checks the coverage, so over-scheduling is harmless.
        last_seq = user_turn.seq + 1
        uncovered_outside_window = last_seq - strategy.recent_turns - covered
        # Turns the budget already dropped from the window reach the model in no form
        # until a summary covers them: summarise them now, whatever the threshold.
        dropped = [
            seq
            for seq in (prepared.context.accounts["recent"].dropped_seqs if prepared and "recent" in prepared.context.accounts else ())
            if seq > covered
        ]
        upto = max(dropped, default=0)
        if uncovered_outside_window >= self.settings.summary_threshold or upto:
            jobs.append("summary")
            self.jobs.schedule(
                tenant, session_id, "summary",
                lambda: self.summarize_now(tenant, session_id, upto=upto or None),
                coalesce=True,
            )
        return jobs

    async def _score_emotion(self, tenant: str, session_id: str, turn: Turn) -> None:
        score = await self.emotion.score(turn.content)
        await self.store.set_emotions(tenant, session_id, {turn.seq: max(0.0, min(1.0, score))})

    async def _extract_constraints(self, tenant: str, session_id: str, turn: Turn) -> None:
        from .processors.constraints import apply_update

        for _ in range(5):  # compare-and-set: retry against a newer version
            state = await self.store.load(tenant, session_id, recent=0)
            update = await self.extractor.extract(turn, state.constraints)
            if not update.upsert and not update.remove_keys:
                return
            merged = apply_update(state.constraints, update)
            if await self.store.commit_constraints(
                tenant, session_id, merged, expected_version=state.constraints_version
            ):
                return
        raise RuntimeError("constraints kept changing underneath; will retry")

    async def summarize_now(
        self, tenant: str, session_id: str, *, force: bool = False, upto: int | None = None
    ) -> bool:
        """Fold the turns outside the recent window into the summary.

        ``upto`` extends the range to that turn even inside the window (turns the
        budget dropped), and then any number of due turns is enough. Returns False
        when fewer than ``summary_threshold`` turns are due (any number with
        ``force``), or when a newer summary won the race: the result is then
        discarded, never overwriting it.
        """
        strategy = get_strategy(self.settings.strategy)
        info = await self.store.version(tenant, session_id)
        state = await self.store.load(tenant, session_id, recent=0, max_uncovered=0)
        previous = state.summary
        start = state.summary_covers_seq + 1
        end = info.last_seq - strategy.recent_turns
        if upto is not None and upto > end:
            end, force = min(upto, info.last_seq), True
        due = end - start + 1
        if due <= 0 or (due < self.settings.summary_threshold and not force):
            return False
        expected = previous.version if previous else 0
        # An attempt cut off (job timeout) after the summariser answered keeps its result
        # here; the retry commits it instead of paying for the same range twice.
        kept = self._uncommitted.pop((tenant, session_id), None)
        if kept is not None and kept[:3] == (expected, start, info.created_at):
            summary = kept[3]
        else:
            turns = await self.store.turns(tenant, session_id, from_seq=start, to_seq=end)
            if not turns:
                return False
            result = await self.summarizer.summarize(previous, turns)
            summary = Summary(
                text=result.text,
                covers_seq=turns[-1].seq,
                tokens=self.counter.count(result.text),
                created_at=utc_now(),
            )
        if len(self._uncommitted) >= 1024:
            self._uncommitted.clear()
        self._uncommitted[(tenant, session_id)] = (expected, start, info.created_at, summary)
        committed = await self.store.commit_summary(tenant, session_id, summary, expected_version=expected)
        self._uncommitted.pop((tenant, session_id), None)
        return committed

    def _log_turn(
        self, prepared: PreparedTurn, user_turn: Turn, ttft: float | None, model_ms: float, partial: bool, jobs: list[str]
    ) -> None:
        ctx = prepared.context
        log.info(
            "turn session=%s seq=%d %s rewritten=%s partial=%s ttft_ms=%s model_ms=%.1f jobs=%s",
            prepared.state.session_id,
            user_turn.seq,
            ctx.summary_line(),
            bool(prepared.rewrite and prepared.rewrite.changed),
            partial,
            f"{ttft:.1f}" if ttft is not None else "-",
            model_ms,
            ",".join(jobs),
            extra={
                "session": prepared.state.session_id,
                "tenant": prepared.state.tenant,
                "tokens": {name: a.used for name, a in ctx.accounts.items()},
                "total_tokens": ctx.total_tokens,
                "exact_tokens": ctx.exact,
                "rewritten": bool(prepared.rewrite and prepared.rewrite.changed),
                "ttft_ms": ttft,
                "model_ms": model_ms,
                "jobs": jobs,
            },
        )

    async def drain(self) -> None:
        """Wait for every scheduled background job (tests, shutdown)."""
        await self.jobs.drain()

    async def close(self, *, drain_timeout_s: float = 30.0) -> None:
        """Finish background jobs (at most ``drain_timeout_s`` seconds, then cancel the rest:
        a summary that did not run is scheduled again by the session's next turn) and close the store."""
        try:
            await asyncio.wait_for(self.jobs.drain(), drain_timeout_s)
        except TimeoutError:
            log.warning("background jobs still running after %.0f s at shutdown: cancelled", drain_timeout_s)
            await self.jobs.aclose()
        await self.store.close()
