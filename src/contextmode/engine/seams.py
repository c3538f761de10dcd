"""The engine's seams that have no home lower down: its processors as one typed value, and
the recaller with its optional abilities (a Protocol each, checked by a `TypeGuard` function).

The other seams live with their layer: `store.base.Store`, `models.base.ChatModel`,
`tokens.base.TokenCounter`, the processors' Protocols in `processors.base`, and
`jobs.JobQueue` for the background job runner.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeGuard, runtime_checkable

from .._protocols import implements
from ..memory.strategies import Strategy
from ..processors.base import (
    ConstraintExtractor,
    ContextDetector,
    EmotionScorer,
    Rewriter,
    Summarizer,
    calls_no_model,
)
from ..store.base import Store
from ..types import SessionState, Turn

__all__ = [
    "CachingRecaller",
    "IndexingRecaller",
    "Processors",
    "Recaller",
    "RecallingStrategy",
    "SafeWithSharedConnection",
    "caches_sessions",
    "indexes_turns",
    "recall_limit",
    "safe_with_shared_connection",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class Processors:
    """The language processors of one engine (`build_engine` picks offline or LLM ones)."""

    detector: ContextDetector
    rewriter: Rewriter
    summarizer: Summarizer
    extractor: ConstraintExtractor
    emotion: EmotionScorer

    @classmethod
    def offline(cls) -> Processors:
        """The offline processors (no model calls)."""
        from ..processors.constraints import OfflineConstraintExtractor
        from ..processors.detect import OfflineContextDetector
        from ..processors.emotion import OfflineEmotionScorer
        from ..processors.rewrite import OfflineRewriter
        from ..processors.summarize import OfflineSummarizer

        return cls(
            detector=OfflineContextDetector(),
            rewriter=OfflineRewriter(),
            summarizer=OfflineSummarizer(),
            extractor=OfflineConstraintExtractor(),
            emotion=OfflineEmotionScorer(),
        )


class SafeWithSharedConnection:
    """Marker of a collaborator the engine may run while a turn or a job burst holds its shared
    store connection (`store.base.SharesConnection`): it waits on nothing but the store and the
    CPU. A `processors.base.ModelFree` processor (or the BM25 recaller) is such a collaborator;
    this marker is for anything else (a custom recaller or processor that calls no model).
    Before an unmarked one runs the connection goes back to the pool, so a model that takes
    seconds never keeps one from other requests. A plain class: its check is a class check."""


def safe_with_shared_connection(collaborator: object) -> bool:
    """True when ``collaborator`` may run while the turn's store connection is held."""
    return isinstance(collaborator, SafeWithSharedConnection) or calls_no_model(collaborator)


class Recaller(Protocol):
    """Finds a session's older turns relevant to the current message (the recall layer)."""

    async def recall(
        self, store: Store, state: SessionState, message: str, *, recent_turns: int = 6, limit: int | None = None
    ) -> Sequence[Turn]: ...


@runtime_checkable
class IndexingRecaller(Protocol):
    """A recaller that keeps its own index: told about every new turn (O(new turns))."""

    def observe(self, tenant: str, session_id: str, turns: Sequence[Turn]) -> None: ...


@runtime_checkable
class CachingRecaller(Protocol):
    """A recaller that holds sessions in this process (dropped when a session is erased)."""

    def forget(self, tenant: str, session_id: str) -> bool: ...

    def cached_sessions(self) -> list[tuple[str, str]]: ...


def indexes_turns(recaller: object) -> TypeGuard[IndexingRecaller]:
    """True when ``recaller`` wants to see every new turn."""
    return implements(recaller, IndexingRecaller)


def caches_sessions(recaller: object) -> TypeGuard[CachingRecaller]:
    """True when ``recaller`` holds sessions in memory."""
    return implements(recaller, CachingRecaller)


@runtime_checkable
class RecallingStrategy(Protocol):
    """A strategy with a recall layer: how many recalled turns it takes."""

    @property
    def recall_limit(self) -> int: ...


def recall_limit(strategy: Strategy) -> int:
    """The strategy's recall limit (0: it has no recall layer)."""
    return int(strategy.recall_limit or 0) if _recalls(strategy) else 0


def _recalls(strategy: object) -> TypeGuard[RecallingStrategy]:
    return implements(strategy, RecallingStrategy)
