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
from datetime import datetime, timedelta
from typing import Any, Literal

from .agent_turn import AgentRequest
from .assembly import AssemblyConfig, Context, CurrentTurn, assemble, cut_to_tokens, to_messages
from .assembly.agent import as_sentence
from .errors import ModelError, NoPreviousAnswer
from .jobs import JobRunner, JobSettings
from .memory.budget import Budget
from .memory.strategies import Strategy, get_strategy
from .models.base import ChatModel, ToolCallDelta
from .models.offline import OfflineResponder
from .processors.base import (
    ConstraintExtractor,
    ContextDetector,
    ContextualEmotionScorer,
    Detection,
    EmotionScorer,
    PriorTurn,
    Rewrite,
    Rewriter,
    Summarizer,
)
from .processors.intents import build_follow_up_prompt
from .processors.verify import verified
from .settings import EngineSettings, Mode
from .store.base import Store, keeps_traces
from .store.postings import has_postings
from .tokens.base import TokenCounter
from .trace import ExchangeOutcome, build_trace, cap_trace, exchange_count
from .types import (
    ChatMessage,
    NewTurn,
    SessionState,
    Summary,
    ToolCall,
    Turn,
    require_text,
    utc_now,
    validate_id,
)

__all__ = ["Engine", "PreparedTurn", "TurnEvent", "TurnResult"]

log = logging.getLogger("contextmode.turn")

EMOTION_CONTEXT_TURNS = 20
"""Earlier turns a contextual emotion scorer reads (the offline one's context window)."""
_TEMPLATE_INTENTS = frozenset({"detail", "simplify", "example", "summary"})
"""Seed 000 intents answered from the last answer; a pronoun goes through the rewriter instead."""


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


@dataclass(frozen=True, kw_only=True)
class TurnEvent:
    """One event of a streamed turn."""

    kind: Literal["prepared", "delta", "tool_call", "done"]
    text: str = ""
    """The answer's text delta (``delta``) or the whole answer (``done``)."""
    prepared: PreparedTurn | None = None
    """Set on ``prepared``."""
    result: TurnResult | None = None
    """Set on ``done``."""
    tool_call: ToolCallDelta | None = None
    """Set on ``tool_call``: a piece of a tool call the model is making (agent turns)."""


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
            order=self.settings.order,
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
        require_text(message)
        mode = mode or self.settings.mode
        chosen = get_strategy(strategy or self.settings.strategy)
        state = await self.load(tenant, session_id, chosen)
        # Engine notices (the offline responder's text) describe a request instead of
        # answering it: they never feed memory, the rewrite or the model's history.
        state = _without_notices(state)
        # Tool results (often huge JSON) are no antecedents for a pronoun either.
        history = [t for t in state.turns if t.role != "tool"]
        detection = await self.detector.detect(message, history) if history else Detection(needs_context=False)
        current, rewrite, rejected = await self._rewrite_step(state, message, detection, chosen)
        verified_text = rewrite.text if rewrite is not None and rewrite.changed and rewrite.verified else None
        if mode == "decoupled" and verified_text is not None:
            current = verified_text
        recall_limit = int(getattr(chosen, "recall_limit", 0) or 0)
        if self.recaller is not None and recall_limit:
            recalled = await self.recaller.recall(
                self.store, state, verified_text or current, limit=recall_limit, recent_turns=chosen.recent_turns
            )
            state = replace(state, recalled=tuple(t for t in recalled if not t.notice))
        assembled_state = state
        if mode == "decoupled":
            # Decoupled mode (design article 002): memory only feeds the rewrite; the answer
            # sees the standalone question and the pinned constraints, never the raw history.
            # Without a verified rewrite it sees the user's message and the last exchange.
            last = () if current != message else _last_exchange(state.turns)
            assembled_state = replace(state, turns=last, summary=None, key_moments=(), recalled=())
        context = assemble(
            assembled_state,
            message,
            counter=self.counter,
            strategy=chosen,
            budget=self._budget(),
            config=self._config(),
            now=now,
            current=CurrentTurn(
                standalone=current if current != message else None,
                hint=verified_text if mode != "decoupled" and current == message else None,
            ),
        )
        return PreparedTurn(
            state=state,
            detection=detection,
            rewrite=rewrite,
            rejected_rewrite=rejected,
            context=context,
            messages=to_messages(context),
            mode=mode,
            prepare_ms=(time.perf_counter() - started) * 1000,
        )

    async def _rewrite_step(
        self, state: SessionState, message: str, detection: Detection, strategy: Strategy
    ) -> tuple[str, Rewrite | None, Rewrite | None]:
        """``(current message, verified rewrite or None, rejected rewrite or None)``: a
        follow-up template (design article 000) answers a follow-up intent; otherwise the rewriter's output goes
        through the verifier (a rewrite is a hint until it accepts it)."""
        if detection.intent in _TEMPLATE_INTENTS:
            if not state.last_answer:
                raise NoPreviousAnswer(detection.intent or "follow-up")
            return self._follow_up_prompt(detection, state.last_answer, message), None, None
        if not (detection.needs_context and self.settings.rewrite and state.turns):
            return message, None, None
        recent = [t for t in state.turns if t.role != "tool"][-max(strategy.recent_turns, 4):]
        summary = state.summary.text if state.summary else None
        rewrite, rejected = await verified(self.rewriter, message, recent, summary=summary)
        return message, rewrite, rejected

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
        meta["turn"] = await self._exchanges_so_far(tenant, session_id, prepared.state) + 1
        if prepared.rewrite is not None and prepared.rewrite.changed:
            meta["rewrite"] = prepared.rewrite.text
            meta["rewrite_verified"] = prepared.rewrite.verified
        if prepared.rejected_rewrite is not None:
            meta["rewrite_rejected"] = {
                "text": prepared.rejected_rewrite.text,
                "reason": prepared.rejected_rewrite.reason,
                "source": prepared.rejected_rewrite.source,
            }
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
            model_ms = (time.perf_counter() - model_started) * 1000
            assistant_turn = await asyncio.shield(
                self._finish(tenant, session_id, user_turn, answer, partial, prepared, ttft, model_ms)
            )
            jobs = self._schedule_jobs(tenant, session_id, user_turn, prepared)
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

    def stream_agent(
        self, tenant: str, session_id: str, request: AgentRequest, *, mode: Mode | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> AsyncIterator[TurnEvent]:
        """One step of an agent loop (a user message or tool results in, text or tool calls
        out), streamed like `stream`; see `contextmode.agent_turn`."""
        from .agent_turn import stream_agent_turn

        return stream_agent_turn(self, tenant, session_id, request, mode=mode, metadata=metadata)

    async def turn(self, tenant: str, session_id: str, message: str, **kwargs: Any) -> TurnResult:
        """Run one turn and return the whole answer."""
        result: TurnResult | None = None
        async for event in self.stream(tenant, session_id, message, **kwargs):
            if event.kind == "done":
                result = event.result
        assert result is not None
        return result

    async def _finish(
        self, tenant: str, session_id: str, user_turn: Turn, answer: str, partial: bool,
        prepared: PreparedTurn, ttft_ms: float | None, model_ms: float,
    ) -> Turn | None:
        """Store the answer (unless nothing arrived), then the exchange's trace."""
        stored: Turn | None = None
        if answer or not partial:  # nothing arrived: the user turn stays, no empty answer is stored
            meta: dict[str, Any] = {"reply_to": user_turn.seq, "model": self.model.name}
            if "turn" in user_turn.metadata:
                meta["turn"] = user_turn.metadata["turn"]
            if partial:
                meta["partial"] = True
            if isinstance(self.model, OfflineResponder):
                # A description of the request, not an answer: an engine notice, never memory.
                meta["offline"] = True
                meta["notice"] = True
            appended = await self.store.append(
                tenant,
                session_id,
                [NewTurn(role="assistant", content=answer, tokens=self.counter.count(answer), metadata=meta)],
            )
            self._observe(tenant, session_id, appended)
            stored = appended[0]
        number = user_turn.metadata.get("turn")
        if isinstance(number, int):
            outcome = ExchangeOutcome(
                turn=number, user_seq=user_turn.seq, answer_seq=stored.seq if stored else None,
                ttft_ms=ttft_ms, model_ms=model_ms, partial=partial,
            )
            await self._keep_trace(tenant, session_id, prepared, outcome)
        return stored

    async def _keep_trace(
        self, tenant: str, session_id: str, prepared: PreparedTurn, outcome: ExchangeOutcome
    ) -> None:
        settings = self.settings
        number = outcome.turn
        if not settings.trace_keep or not keeps_traces(self.store):
            return
        trace = build_trace(prepared, outcome, processors=self._processor_versions(), model=self.model.name)
        max_age = settings.trace_max_age_days
        try:
            await self.store.put_trace(
                tenant, session_id, cap_trace(trace, settings.trace_max_bytes),
                keep=settings.trace_keep,
                older_than=trace.created_at - timedelta(days=max_age) if max_age else None,
            )
        except Exception:
            # The turn and its answer are stored; a lost trace must not fail the reply.
            log.warning("trace of turn %d (session %s) not kept", number, session_id, exc_info=True)

    def _processor_versions(self) -> dict[str, str]:
        """Seam → the implementation that served the turn, with the package version.

        Read at every turn (collaborators can be swapped on a live engine); cheap.
        """
        from . import __version__

        seams = {
            "detector": self.detector, "rewriter": self.rewriter, "summarizer": self.summarizer,
            "extractor": self.extractor, "emotion": self.emotion, "counter": self.counter,
            "recaller": self.recaller,
        }
        return {
            name: f"{type(obj).__name__} {getattr(obj, 'version', None) or __version__}"
            for name, obj in seams.items()
            if obj is not None
        }

    async def _exchanges_so_far(self, tenant: str, session_id: str, state: SessionState | None) -> int:
        """How many user messages the session holds (the newest's exchange number).

        Read from the newest user turn's stamp: O(1) from the loaded tail. Only a
        session whose newest user turn predates the numbering counts them all, once.
        """
        if state is not None:
            if state.last_seq == 0:
                return 0
            known = exchange_count(state.turns)
            if known is not None:
                return known
        last_seq = state.last_seq if state is not None else (await self.store.version(tenant, session_id)).last_seq
        if last_seq == 0:
            return 0
        tail = await self.store.turns(tenant, session_id, from_seq=max(1, last_seq - 3))
        known = exchange_count(tail)
        if known is not None:
            return known
        history = await self.store.turns(tenant, session_id)
        return sum(1 for t in history if t.role == "user")

    # -- background work -------------------------------------------------

    async def record(
        self, tenant: str, session_id: str, role: Literal["user", "assistant"], content: str,
        *, metadata: dict[str, Any] | None = None, created_at: datetime | None = None,
        user_id: str | None = None,
    ) -> Turn:
        """Append one turn without calling the model (imports, replays) and schedule the
        same background jobs a live turn would. ``created_at`` dates an imported turn
        (default: now). The turn is numbered by exchange like a live one."""
        meta = dict(metadata or {})
        meta["turn"] = await self._exchanges_so_far(tenant, session_id, None) + (role == "user")
        new = NewTurn(
            role=role, content=content, tokens=self.counter.count(content), metadata=meta,
            created_at=created_at or utc_now(),
        )
        turn = (await self.store.append(tenant, session_id, [new], user_id=user_id))[0]
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
        # A store that keeps the recall index wrote it with the turns: nothing to do here.
        if (
            self.recaller is not None
            and hasattr(self.recaller, "observe")
            and not has_postings(self.store)
        ):
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
        if isinstance(self.emotion, ContextualEmotionScorer):
            # The turns just before: the conversation's mood and the speaker's baseline.
            earlier = await self.store.turns(
                tenant, session_id, from_seq=max(1, turn.seq - EMOTION_CONTEXT_TURNS), to_seq=turn.seq - 1
            )
            prior = [PriorTurn(text=t.content, same_speaker=t.role == turn.role) for t in earlier]
            score = await self.emotion.score_in_context(turn.content, prior)
        else:
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
        if upto is not None:
            # Dropped turns reach the model in no form until summarised: any number is due.
            end, force = max(end, min(upto, info.last_seq)), True
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
            # Engine notices are never summarised; the summary still covers their seqs.
            # Tool calls and results are summarised as sentences, never raw JSON.
            remembered = [as_sentence(t) for t in turns if not t.notice]
            if remembered:
                text = (await self.summarizer.summarize(previous, remembered)).text
            else:
                text = previous.text if previous else ""
            summary = Summary(
                text=text,
                covers_seq=turns[-1].seq,
                tokens=self.counter.count(text),
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


def _without_notices(state: SessionState) -> SessionState:
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


def _last_exchange(turns: Sequence[Turn]) -> tuple[Turn, ...]:
    """The newest user turn and the answer after it (decoupled mode without a verified rewrite)."""
    users = [i for i, t in enumerate(turns) if t.role == "user"]
    return tuple(turns[users[-1]:]) if users else tuple(turns[-1:])
