"""The `Engine`: its seams, and one chat turn end to end (each step in its own file).

load → detect a follow-up → rewrite when needed → assemble (`prepare.py`) → stream
the answer (`stream.py`) → persist (`persist.py`) → schedule background jobs
(`schedule.py`). Summaries, constraint extraction and emotion scoring run
afterwards, never on the response path.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from datetime import datetime
from typing import Any, Literal, overload

from ..assembly import AssemblyConfig
from ..jobs import JobQueue, JobRunner, JobSettings
from ..memory.budget import Budget
from ..memory.strategies import Strategy
from ..models.base import ChatModel, closes
from ..models.priority import answering
from ..processors.base import (
    ConstraintExtractor,
    ContextDetector,
    EmotionScorer,
    Rewriter,
    Summarizer,
)
from ..settings import EngineSettings, Mode
from ..store.base import (
    Store,
    StoreAbility,
    TraceRecords,
    keeps_traces,
    load_trace,
)
from ..store.records import TurnTrace
from ..text.pii import require_pii_libraries
from ..tokens.base import TokenCounter
from ..types import NewTurn, SessionKey, SessionState, Turn
from .agent import AgentRequest, stream_agent_turn
from .backlog import Backlog
from .pace import ReplyPace
from .parts import PendingSummaries, TurnParts
from .persist import record_turn
from .prepare import load_state, prepare_turn
from .request import USE_DEFAULT, PreparedTurn, TurnEvent, TurnRequest, TurnResult, UseDefault
from .schedule import schedule_jobs, summarize_now
from .seams import Processors, Recaller, caches_sessions
from .stream import stream_turn
from .usage import KeptRequests
from .writes import TraceWrites

__all__ = ["Engine"]

log = logging.getLogger("contextmode.turn")


class Engine:
    """A chat turn with memory. Every collaborator is a seam with an offline default."""

    def __init__(
        self,
        *,
        store: Store,
        model: ChatModel,
        counter: TokenCounter,
        processors: Processors,
        settings: EngineSettings | None = None,
        recaller: Recaller | None = None,
        jobs: JobQueue | None = None,
        system_prompt: str | None = None,
    ) -> None:
        self.store = store
        self.model = model
        self.counter = counter
        self.processors = processors
        self.settings = settings or EngineSettings()
        self.recaller = recaller
        self.system_prompt = system_prompt
        """The default system prompt; a `TurnRequest` may set its own."""
        self.pending_summaries = PendingSummaries()
        """Summaries computed but not committed, by session (a cut-off job's retry commits them)."""
        self.backlog = Backlog()
        """Turns waiting for background work, by session (one job per session covers them all)."""
        self.jobs: JobQueue = jobs or JobRunner(
            store, replace(JobSettings.from_env(), attempts=self.settings.job_attempts)
        )
        self.trace_writes = TraceWrites()
        self.kept_requests = KeptRequests()
        """Per session, what the next exchange's usage needs of the newest trace kept here."""
        """Each exchange's trace write, started as the reply goes out (`trace`, `drain` and
        `close` wait for them)."""
        self.pace = ReplyPace()
        """How long the replies take, per session: the response path's budget (`engine/pace.py`)."""
        self.owns_model = False
        """True when the engine's builder made the model (`build_engine` from ``CONTEXTMODE_LLM_*``):
        `close` then closes the model's HTTP client too; a model passed in stays the caller's."""
        self._keeper = StoreAbility(keeps_traces, store)
        """The store, and itself when it keeps traces: decided once per store, not per turn."""
        if "mask" in (self.settings.pii, *self.settings.pii_tenants.values()):
            require_pii_libraries()  # a clear error now, not at the first stored turn

    # -- the processors, by name (a new one replaces the `Processors` value) --

    @property
    def detector(self) -> ContextDetector:
        return self.processors.detector

    @detector.setter
    def detector(self, value: ContextDetector) -> None:
        self.processors = replace(self.processors, detector=value)

    @property
    def rewriter(self) -> Rewriter:
        return self.processors.rewriter

    @rewriter.setter
    def rewriter(self, value: Rewriter) -> None:
        self.processors = replace(self.processors, rewriter=value)

    @property
    def summarizer(self) -> Summarizer:
        return self.processors.summarizer

    @summarizer.setter
    def summarizer(self, value: Summarizer) -> None:
        self.processors = replace(self.processors, summarizer=value)

    @property
    def extractor(self) -> ConstraintExtractor:
        return self.processors.extractor

    @extractor.setter
    def extractor(self, value: ConstraintExtractor) -> None:
        self.processors = replace(self.processors, extractor=value)

    @property
    def emotion(self) -> EmotionScorer:
        return self.processors.emotion

    @emotion.setter
    def emotion(self, value: EmotionScorer) -> None:
        self.processors = replace(self.processors, emotion=value)

    # -- the store's shared connection --------------------------------------

    def one_connection(self) -> AbstractAsyncContextManager[None]:
        """A scope in which this task's store calls share one pooled connection, taken at the
        first statement (`store.base.SharesConnection`; a store without one: nothing)."""
        return self.parts().one_connection()

    async def let_go(self) -> None:
        """Hand this task's shared store connection back to the pool (a model is about to work)."""
        await self.parts().let_go()

    async def let_go_before(self, collaborator: object) -> None:
        """`let_go` unless ``collaborator``, about to run, is `SafeWithSharedConnection` (it calls
        no model: the offline processors, the BM25 recaller)."""
        await self.parts().let_go_before(collaborator)

    # -- what one turn works with -------------------------------------------

    def parts(self) -> TurnParts:
        """The collaborators a turn or a job works with, as they are now (`engine.parts`):
        taken once at the start of each, so a collaborator swapped meanwhile serves the next."""
        return TurnParts(
            store=self.store, model=self.model, counter=self.counter, processors=self.processors,
            settings=self.settings, recaller=self.recaller, system_prompt=self.system_prompt, jobs=self.jobs,
            trace_writes=self.trace_writes, pending_summaries=self.pending_summaries, backlog=self.backlog,
            trace_keeper=self.trace_keeper(), kept_requests=self.kept_requests, pace=self.pace,
        )

    # -- preparing -------------------------------------------------------

    def budget(self) -> Budget:
        """The token budget of one context."""
        return self.parts().budget()

    def keepable(self, tenant: str, turns: Sequence[NewTurn]) -> list[NewTurn]:
        """``turns`` as ``tenant``'s store may keep them: personal data masked under
        ``pii="mask"`` (`contextmode.engine.privacy`); every append of the engine goes through here."""
        return self.parts().keepable(tenant, turns)

    def assembly_config(self, system_prompt: str | UseDefault | None = USE_DEFAULT) -> AssemblyConfig:
        """How contexts are assembled; ``system_prompt`` overrides the engine's for one turn."""
        return self.parts().assembly_config(system_prompt)

    async def load(self, tenant: str, session_id: str, strategy: Strategy) -> SessionState:
        """The session state the strategy needs (O(window))."""
        return await load_state(self.parts(), SessionKey(tenant, session_id), strategy)

    @overload
    async def prepare(self, request: TurnRequest, /) -> PreparedTurn: ...

    @overload
    async def prepare(
        self, tenant: str, session_id: str, message: str, /, *,
        mode: Mode | None = None, strategy: str | Strategy | None = None, now: datetime | None = None,
    ) -> PreparedTurn: ...

    async def prepare(
        self, request: TurnRequest | str, session_id: str | None = None, message: str | None = None, /, *,
        mode: Mode | None = None, strategy: str | Strategy | None = None, now: datetime | None = None,
    ) -> PreparedTurn:
        """Load, detect, rewrite and assemble, without writing anything or calling the answer model.

        Takes a `TurnRequest`, or ``(tenant, session_id, message)`` and the options.
        """
        if not isinstance(request, TurnRequest):
            request = TurnRequest(
                key=SessionKey(request, session_id or ""), message=message or "", mode=mode, strategy=strategy, now=now
            )
        return await prepare_turn(self.parts(), request)

    # -- the turn --------------------------------------------------------

    def stream(self, request: TurnRequest) -> AsyncIterator[TurnEvent]:
        """Run one turn: ``Prepared``, then ``Delta`` events, then ``Done`` (or ``Failed``).

        The user turn is stored before the model is called. The answer is
        stored in a ``finally`` shielded from cancellation, marked ``partial``
        when the stream broke or the client went away; a `ModelError` ends the
        stream with ``Failed`` after the partial answer is safe. An agent step
        (`TurnRequest.agent_step`: tools offered or tool results sent) may also
        yield ``ToolCallPart`` events, and its ``Done`` carries the tool calls.
        """
        if request.agent_step:
            return answering(stream_agent_turn(self.parts(), request))
        return answering(stream_turn(self.parts(), request))

    def stream_agent(
        self, key: SessionKey, step: AgentRequest, *, mode: Mode | None = None,
        metadata: Mapping[str, Any] | None = None, system_prompt: str | UseDefault | None = USE_DEFAULT,
    ) -> AsyncIterator[TurnEvent]:
        """One step of an agent loop (a user message or tool results in, text or tool calls
        out), streamed like `stream`: ``step`` as a `TurnRequest` (`AgentRequest.request`),
        run as an agent step even when it offers no tools (`contextmode.engine.agent`)."""
        request = step.request(key, mode=mode, metadata=metadata, system_prompt=system_prompt)
        return answering(stream_agent_turn(self.parts(), request))

    @overload
    async def turn(self, request: TurnRequest, /) -> TurnResult: ...

    @overload
    async def turn(
        self, tenant: str, session_id: str, message: str, /, *,
        mode: Mode | None = None, strategy: str | Strategy | None = None,
        metadata: dict[str, Any] | None = None, user_id: str | None = None,
    ) -> TurnResult: ...

    async def turn(
        self, request: TurnRequest | str, session_id: str | None = None, message: str | None = None, /, *,
        mode: Mode | None = None, strategy: str | Strategy | None = None,
        metadata: dict[str, Any] | None = None, user_id: str | None = None,
    ) -> TurnResult:
        """Run one turn and return the whole answer; a `ModelError` is raised after the
        partial answer is stored. Takes a `TurnRequest`, or ``(tenant, session_id, message)``."""
        if not isinstance(request, TurnRequest):
            request = TurnRequest(
                key=SessionKey(request, session_id or ""), message=message or "", mode=mode, strategy=strategy,
                metadata=metadata or {}, user_id=user_id,
            )
        last: TurnEvent | None = None
        async for event in self.stream(request):
            last = event
        if last is not None and last.kind == "failed":
            raise last.error
        assert last is not None and last.kind == "done", "a turn's stream ends with done or failed"
        return last.result

    # -- storing without the model ----------------------------------------

    async def record(
        self, tenant: str, session_id: str, role: Literal["user", "assistant"], content: str,
        *, metadata: dict[str, Any] | None = None, created_at: datetime | None = None,
        user_id: str | None = None,
    ) -> Turn:
        """Append one turn without calling the model (imports, replays) and schedule the
        same background jobs a live turn would. ``created_at`` dates an imported turn
        (default: now). The turn is numbered by exchange like a live one."""
        key = SessionKey(tenant, session_id)
        parts = self.parts()
        turn = await record_turn(parts, key, role, content, metadata=metadata, created_at=created_at, user_id=user_id)
        if role == "user":
            schedule_jobs(parts, key, turn, None)
        return turn

    # -- what this process holds -------------------------------------------

    def cached_sessions(self) -> set[SessionKey]:
        """Sessions this process holds anything of in memory (recall index, pending summary, jobs)."""
        held = self.pending_summaries.sessions()
        if caches_sessions(self.recaller):
            held.update(self.recaller.cached_sessions())
        held.update(self.jobs.sessions())
        return {SessionKey(tenant, session_id) for tenant, session_id in held}

    def forget_local(self, key: SessionKey) -> dict[str, int]:
        """Drop everything this process holds of the session (its data is being erased).

        Returns counts: ``recall_cache`` (indexes dropped), ``pending_jobs``
        (jobs cancelled) and ``summary_cache`` (computed, uncommitted summaries).
        """
        tenant, session_id = key.tenant, key.session_id
        dropped_index = 0
        if caches_sessions(self.recaller):
            dropped_index = int(bool(self.recaller.forget(tenant, session_id)))
        self.backlog.forget(key)  # the turns' words go with the jobs
        self.kept_requests.forget(tenant, session_id)
        self.pace.forget(key)
        return {
            "recall_cache": dropped_index,
            "pending_jobs": self.jobs.cancel(tenant, session_id),
            "summary_cache": int(self.pending_summaries.forget(tenant, session_id)),
        }

    # -- kept traces -------------------------------------------------------

    def trace_keeper(self) -> TraceRecords | None:
        """Where the turns' traces are kept: the store, when it keeps them and
        ``settings.trace_keep`` is not 0; else ``None``."""
        if not self.settings.trace_keep:
            return None
        return self._keeper.of(self.store)

    async def settle_writes(self, key: SessionKey) -> None:
        """Wait until the session's traces still being written are stored (they are
        written just after each reply): before reading them, or erasing the session."""
        await self.trace_writes.settle(key.tenant, key.session_id)

    async def trace(self, key: SessionKey, turn: int) -> TurnTrace:
        """The kept trace of exchange ``turn`` (a write still running is waited for);
        `SessionNotFound` / `TurnNotFound` otherwise (`store.base.load_trace`)."""
        await self.settle_writes(key)
        return await load_trace(self.store, key, turn)

    def processor_versions(self) -> dict[str, str]:
        """Seam → the implementation that served the turn, with the package version.

        Read at every turn (collaborators can be swapped on a live engine); cheap.
        """
        return self.parts().processor_versions()

    # -- background work -------------------------------------------------

    async def summarize_now(
        self, tenant: str, session_id: str, *, force: bool = False, upto: int | None = None
    ) -> bool:
        """Fold the turns outside the recent window into the summary.

        ``upto`` extends the range to that turn even inside the window (turns the
        budget dropped), and then any number of due turns is enough. Returns False
        when fewer than ``summary_threshold`` turns are due (any number with
        ``force``), or when a newer summary won the race: the result is then
        discarded, never overwriting it. A summariser that must fit the model's window
        (`WindowedSummarizer`, the LLM one) is given the turns in chunks that fit
        ``settings.context_window``, each committed before the next.
        """
        return await summarize_now(self.parts(), SessionKey(tenant, session_id), force=force, upto=upto)

    async def drain(self) -> None:
        """Wait for every pending trace write and scheduled background job (tests, shutdown)."""
        await self.trace_writes.drain()
        await self.jobs.drain()
        await self.trace_writes.drain()

    async def close(self, *, drain_timeout_s: float = 30.0) -> None:
        """Finish the pending trace writes and background jobs (at most ``drain_timeout_s``
        seconds each, then cancel the rest: a summary that did not run is scheduled again by
        the session's next turn; a trace not written is missing), close the store and, when the
        engine made it (`owns_model`), the model's HTTP client."""
        try:
            await asyncio.wait_for(self.trace_writes.drain(), drain_timeout_s)
        except TimeoutError:
            log.warning("trace writes still running after %.0f s at shutdown: cancelled", drain_timeout_s)
            await self.trace_writes.aclose()
        try:
            await asyncio.wait_for(self.jobs.drain(), drain_timeout_s)
        except TimeoutError:
            log.warning("background jobs still running after %.0f s at shutdown: cancelled", drain_timeout_s)
            await self.jobs.aclose()
        await self.store.close()
        if self.owns_model and closes(self.model):
            await self.model.aclose()
