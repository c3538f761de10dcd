"""Seams of the language layer, one Protocol per processor.

Each processor has an offline implementation (the embedded default, no model
needed) and an LLM-backed one (through `contextmode.models`). All methods are
async so both kinds fit the same seam.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, TypeGuard, runtime_checkable

from .._protocols import implements
from ..types import Constraint, Summary, Turn

if TYPE_CHECKING:
    from ..tokens.base import TokenCounter

__all__ = [
    "ConstraintExtractor",
    "ConstraintUpdate",
    "ContextDetector",
    "ContextualEmotionScorer",
    "Detection",
    "EmotionScorer",
    "IntentKind",
    "ModelFree",
    "PriorTurn",
    "Rewrite",
    "Rewriter",
    "StandaloneExtractor",
    "Summarizer",
    "SummaryResult",
    "WindowedSummarizer",
    "calls_no_model",
    "extracts_alone",
    "fits_a_window",
    "scores_in_context",
]

class ModelFree:
    """Marker of a processor that never calls a model (the offline ones): it needs nothing but
    the CPU, so a turn or a job may run it while holding a shared store connection
    (`store.base.SharesConnection`); anything unmarked may call a model, and the connection is
    handed back first. A plain class, not a Protocol: checking it costs a class check."""

    @property
    def model_free(self) -> bool:
        """False when this object calls a model after all (a wrapper around one that does)."""
        return True


def calls_no_model(processor: object) -> bool:
    """True when ``processor`` is `ModelFree` (it never calls a model)."""
    return isinstance(processor, ModelFree) and processor.model_free


IntentKind = Literal["detail", "simplify", "example", "summary", "pronoun"]


@dataclass(frozen=True, kw_only=True)
class Detection:
    """Whether a message needs earlier turns to be understood."""

    needs_context: bool
    """True when the message leans on earlier turns (pronouns, ellipsis, "继续")."""
    score: float = 0.0
    """Confidence 0–1 that it needs context."""
    intent: IntentKind | None = None
    """The follow-up intent over the last answer, if one matched."""
    reason: str = ""
    """Short human-readable why (matched cue, model), for logs and the inspector."""
    sure: bool = False
    """True when the detector is sure of its verdict (a template intent, a probability outside
    its unsure band): `LLMContextDetector` takes such a verdict of its fallback without asking
    the model."""


@dataclass(frozen=True, kw_only=True)
class Rewrite:
    """A standalone version of a context-dependent message."""

    text: str
    """The standalone question (the original message when nothing was changed)."""
    changed: bool
    """False when the rewriter left the message as it was."""
    source: str = ""
    """Which rewriter produced it (``offline``, ``llm``)."""
    verified: bool = False
    """True once the verifier (`processors.verify`) accepted the change."""
    reason: str = ""
    """Why the verifier rejected it (on a rejected rewrite kept for the record)."""


@dataclass(frozen=True, kw_only=True)
class SummaryResult:
    """A new incremental summary and what its audit had to add back."""

    text: str
    """The summary text, audit additions included."""
    restored_facts: Sequence[str] = ()
    """Numbers, entities and constraints the summariser dropped and the audit put back."""


@dataclass(frozen=True, kw_only=True)
class ConstraintUpdate:
    """Changes to the pinned constraints found in one user turn."""

    upsert: Sequence[Constraint] = field(default_factory=tuple)
    """New or changed constraints (a newer value replaces an older one with the same key)."""
    remove_keys: Sequence[str] = field(default_factory=tuple)
    """Keys the user explicitly retracted ("我现在能吃辣了")."""


@runtime_checkable
class ContextDetector(Protocol):
    async def detect(self, message: str, history: Sequence[Turn]) -> Detection:
        """Decide whether ``message`` needs ``history`` (oldest first) to be understood."""
        ...


@runtime_checkable
class Rewriter(Protocol):
    async def rewrite(
        self, message: str, history: Sequence[Turn], *, summary: str | None = None
    ) -> Rewrite:
        """Rewrite ``message`` into one standalone question using the memory context."""
        ...


@runtime_checkable
class Summarizer(Protocol):
    async def summarize(self, previous: Summary | None, turns: Sequence[Turn]) -> SummaryResult:
        """Fold ``turns`` (not yet covered) into ``previous`` and return the new summary."""
        ...


@runtime_checkable
class WindowedSummarizer(Summarizer, Protocol):
    """A summariser whose one call must fit a model's context window (`LLMSummarizer`).

    The engine then folds the due turns in chunks, each call within its window
    (`engine.schedule.summarize_now`); a summariser without this ability gets every due turn at once.
    """

    def call_tokens(self, previous: Summary | None, turns: Sequence[Turn], counter: TokenCounter) -> int | None:
        """Tokens of the model's window one `summarize` call of ``turns`` takes: the request it
        sends (counted with ``counter``) plus the output it allows; ``None``: no window to fit."""
        ...


def fits_a_window(summarizer: object) -> TypeGuard[WindowedSummarizer]:
    """True when ``summarizer`` can say what one call costs of a model's window."""
    return implements(summarizer, WindowedSummarizer)


@runtime_checkable
class ConstraintExtractor(Protocol):
    async def extract(self, turn: Turn, current: Sequence[Constraint]) -> ConstraintUpdate:
        """Find constraints, preferences and identity facts stated in a user ``turn``."""
        ...


@runtime_checkable
class StandaloneExtractor(ConstraintExtractor, Protocol):
    """An extractor that can tell, without the stored constraints, what most turns change
    (`OfflineConstraintExtractor`): the constraints job then reads none for a turn that
    states nothing. A model-backed extractor is always given them."""

    def extract_alone(self, turn: Turn) -> ConstraintUpdate | None:
        """``extract(turn, current)`` for any ``current``, when the update does not depend on
        it (the turn retracts nothing); ``None`` when it does (call `extract` with them)."""
        ...


def extracts_alone(extractor: object) -> TypeGuard[StandaloneExtractor]:
    """True when ``extractor`` can extract a turn without the stored constraints."""
    return implements(extractor, StandaloneExtractor)


@runtime_checkable
class EmotionScorer(Protocol):
    async def score(self, text: str) -> float:
        """Emotion intensity of ``text`` from 0 (neutral) to 1 (overwhelming)."""
        ...


@dataclass(frozen=True, kw_only=True)
class PriorTurn:
    """An earlier turn of the conversation, as context for scoring the next one."""

    text: str
    same_speaker: bool
    """Whether the speaker of the scored turn said it (the speaker's baseline)."""


@runtime_checkable
class ContextualEmotionScorer(Protocol):
    """An `EmotionScorer` that also reads the turns before (the engine passes the last few)."""

    async def score(self, text: str) -> float: ...

    async def score_in_context(self, text: str, prior: Sequence[PriorTurn]) -> float:
        """Intensity 0–1 of ``text`` said after ``prior`` (oldest first)."""
        ...


def scores_in_context(scorer: object) -> TypeGuard[ContextualEmotionScorer]:
    """True when ``scorer`` reads the turns before the one it scores."""
    return implements(scorer, ContextualEmotionScorer)
