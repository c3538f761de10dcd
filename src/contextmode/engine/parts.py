"""What a turn's steps work with: `TurnParts`, one frozen value the `Engine` hands each step.

The step modules (`prepare.py`, `stream.py`, `persist.py`, `schedule.py`, `agent.py`) never
see the `Engine`: each turn, job or summary takes the engine's collaborators once
(`Engine.parts`; they may be swapped on a live engine between turns) and passes them down.
What the engine keeps between turns (the pending trace writes, the computed but uncommitted
summaries, the job queue) is reached through typed holders, never through private members.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime

from .._version import __version__
from ..assembly import AssemblyConfig
from ..jobs import JobQueue
from ..memory.budget import Budget
from ..models.base import ChatModel
from ..settings import EngineSettings
from ..store.base import Store, TraceRecords, let_go, one_connection
from ..tokens.base import TokenCounter
from ..types import NewTurn, SessionKey, Summary
from .backlog import Backlog
from .pace import ReplyPace
from .privacy import keepable
from .request import UseDefault
from .seams import Processors, Recaller, safe_with_shared_connection
from .usage import KeptRequests
from .writes import TraceWrites

__all__ = ["PendingSummaries", "PendingSummary", "TurnParts"]


@dataclass(frozen=True, kw_only=True, slots=True)
class PendingSummary:
    """A summary computed but not committed (its job was cut off after the summariser answered)."""

    expected_version: int
    """The summary version it was to replace."""
    first_seq: int
    """The first turn it folds in."""
    session_created: datetime | None
    """The session's creation time (a session erased and made again does not reuse it)."""
    summary: Summary


class PendingSummaries:
    """The summaries computed but not committed, by session: a retry commits the one kept here
    instead of paying for the same range twice. Bounded (cleared past 1024 sessions)."""

    _LIMIT = 1024

    def __init__(self) -> None:
        self._by_session: dict[tuple[str, str], PendingSummary] = {}

    def take(self, key: SessionKey) -> PendingSummary | None:
        """The session's pending summary, removed."""
        return self._by_session.pop((key.tenant, key.session_id), None)

    def keep(self, key: SessionKey, pending: PendingSummary) -> None:
        if len(self._by_session) >= self._LIMIT:
            self._by_session.clear()
        self._by_session[(key.tenant, key.session_id)] = pending

    def forget(self, tenant: str, session_id: str) -> bool:
        """Drop the session's pending summary; True when there was one."""
        return self._by_session.pop((tenant, session_id), None) is not None

    def sessions(self) -> set[tuple[str, str]]:
        return set(self._by_session)


@dataclass(frozen=True, kw_only=True, slots=True)
class TurnParts:
    """The collaborators and holders one turn (or one background job) works with."""

    store: Store
    model: ChatModel
    counter: TokenCounter
    processors: Processors
    settings: EngineSettings
    recaller: Recaller | None
    system_prompt: str | None
    """The engine's default system prompt; a `TurnRequest` may set its own."""
    jobs: JobQueue
    trace_writes: TraceWrites
    pending_summaries: PendingSummaries
    backlog: Backlog
    """The session's turns waiting for background work (`engine/backlog.py`)."""
    trace_keeper: TraceRecords | None
    """Where traces are kept (`Engine.trace_keeper`); ``None``: not kept."""
    kept_requests: KeptRequests
    """Per session, what the next exchange's usage needs of the newest kept trace."""
    pace: ReplyPace
    """How long the replies take (`engine/pace.py`): the response path's budget."""

    # -- the store's shared connection --------------------------------------

    def one_connection(self) -> AbstractAsyncContextManager[None]:
        """A scope in which this task's store calls share one pooled connection (`Engine.one_connection`)."""
        return one_connection(self.store)

    async def let_go(self) -> None:
        """Hand this task's shared store connection back to the pool (a model is about to work)."""
        await let_go(self.store)

    async def let_go_before(self, collaborator: object) -> None:
        """`let_go` unless ``collaborator``, about to run, is `SafeWithSharedConnection`."""
        if not safe_with_shared_connection(collaborator):
            await let_go(self.store)

    # -- what the settings say ---------------------------------------------

    def budget(self) -> Budget:
        """The token budget of one context."""
        return Budget(context_window=self.settings.context_window, reply_reserve=self.settings.reply_reserve)

    def keepable(self, tenant: str, turns: Sequence[NewTurn]) -> list[NewTurn]:
        """``turns`` as ``tenant``'s store may keep them (`contextmode.engine.privacy`)."""
        return keepable(self.settings.pii_for(tenant), self.counter, turns)

    def assembly_config(self, system_prompt: str | UseDefault | None) -> AssemblyConfig:
        """How contexts are assembled; ``system_prompt`` overrides the engine's for one turn."""
        return AssemblyConfig(
            order=self.settings.order,
            locale=self.settings.locale,
            system_prompt=self.system_prompt if isinstance(system_prompt, UseDefault) else system_prompt,
            raw_message=self.settings.raw_message,
        )

    def processor_versions(self) -> dict[str, str]:
        """Seam → the implementation that served the turn, with the package version."""
        p = self.processors
        seams: dict[str, object] = {
            "detector": p.detector, "rewriter": p.rewriter, "summarizer": p.summarizer,
            "extractor": p.extractor, "emotion": p.emotion, "counter": self.counter,
            "recaller": self.recaller,
        }
        return {
            name: f"{type(obj).__name__} {getattr(obj, 'version', None) or __version__}"
            for name, obj in seams.items()
            if obj is not None
        }
