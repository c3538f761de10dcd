"""Memory strategies: which stored material is a candidate for each layer.

A strategy looks at the loaded `SessionState` and returns a `MemoryPlan`:
candidates per layer and default shares. It never counts tokens or cuts text;
the assembler fits the plan into the budget. Strategies (seeds 001, 002, 003):

- ``window``: the last N turns verbatim (sliding window);
- ``token_window``: as many of the newest turns as the budget holds;
- ``summary``: summary + the last exchange (summary compression);
- ``sliding_summary``: summary + the last N turns (the default, N = 8);
- ``hybrid``: recent window + key moments (emotion > 0.7, at most 5, ranked
  with a time decay) + summary, shared 60 / 25 / 15.

The shipped ``default``, the prompt-cache ``steady`` and ``hybrid_recall`` add a recall layer; they
live in `recall.strategy`; `contextmode.memory` registers them when it is
imported.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, TypeGuard, runtime_checkable

from .._protocols import implements
from ..errors import ConfigError
from ..types import SessionState, Summary, Turn
from .budget import LayerName

__all__ = [
    "STRATEGIES",
    "Hybrid",
    "MemoryPlan",
    "SlidingSummary",
    "SlidingWindow",
    "Strategy",
    "SummaryKeeping",
    "TokenWindow",
    "get_strategy",
    "register_strategy",
    "summary_keeps",
    "uncovered",
]

# The fixed-layer budget's allocations as weights: profile 200, recent 4000, summary 1500.
_FIXED_LAYER_SHARES: Mapping[LayerName, float] = {"constraints": 200, "recent": 4000, "summary": 1500}


@dataclass(frozen=True, kw_only=True)
class MemoryPlan:
    """Candidates for each memory layer, before budgeting."""

    recent: Sequence[Turn] = ()
    """Turns to keep verbatim, oldest first; the assembler drops from the oldest end."""
    summary: Summary | None = None
    """The summary to show, if any."""
    key_moments: Sequence[Turn] = ()
    """Older emotional turns, best first."""
    recall: Sequence[Turn] = ()
    """Older turns relevant to the message, best first."""
    backfill: Sequence[Turn] = ()
    """Older loaded turns, newest first, that take budget no layer used: the recent window
    grows back over them (summary coverage notwithstanding), a turn already shown by recall or
    the key moments moving into it. Empty for strategies that keep a fixed window."""
    shares: Mapping[LayerName, float] = field(default_factory=dict)
    """Default weights of the flexible layers for this strategy."""
    steady_from: int | None = None
    """A steady window (docs/caching.md) from this turn on (the first the summary does not
    cover), so that a request repeats the previous request's prefix, what prompt caches reuse:
    the window's budget depends neither on the message nor on what recall finds; it holds every
    turn from here while they fit and, once they no longer do, drops a block of its oldest turns
    at once (the summary then folds them in: one change for many turns); pins said inside the
    window are left to it. ``None``: the window slides a turn at a time over what the other
    layers leave (`recent`, `backfill`)."""
    volatile_max_tokens: int | None = None
    """With ``steady_from``: tokens at most for the layers after the window (key moments, recall),
    the rest of their share going to the window; ``None``: their whole share."""


@runtime_checkable
class Strategy(Protocol):
    @property
    def name(self) -> str:
        """Registry name (``sliding_summary``…)."""
        ...

    @property
    def recent_turns(self) -> int:
        """How many newest turns the loader must provide at least."""
        ...

    @property
    def key_moment_limit(self) -> int:
        """How many key-moment candidates the loader should fetch (0 = none)."""
        ...

    def plan(self, state: SessionState, message: str, *, now: datetime) -> MemoryPlan:
        """Pick the candidates for each layer from ``state``."""
        ...


@runtime_checkable
class SummaryKeeping(Protocol):
    """A strategy that names how many of the newest turns the summary leaves to its window."""

    @property
    def summary_keeps(self) -> int:
        """Newest turns the summary leaves out when it is due by count (turns the window drops
        are folded in whatever this says)."""
        ...


def summary_keeps(strategy: Strategy) -> int:
    """The newest turns a summary leaves out: the strategy's ``summary_keeps`` (a steady window,
    whose turns are summarised once it drops them) or else its ``recent_turns``."""
    if _keeps_summary(strategy):
        return strategy.summary_keeps
    return strategy.recent_turns


def _keeps_summary(strategy: object) -> TypeGuard[SummaryKeeping]:
    return implements(strategy, SummaryKeeping)


def _tail(turns: Sequence[Turn], n: int) -> Sequence[Turn]:
    return turns[-n:] if n > 0 else ()


def uncovered(state: SessionState, at_least: int) -> Sequence[Turn]:
    """Turns the summary does not cover yet, and at least the newest ``at_least``."""
    covers = state.summary_covers_seq
    turns = list(state.turns)
    start = next((i for i, t in enumerate(turns) if t.seq > covers), len(turns))
    if len(turns) - start < at_least:
        start = max(0, len(turns) - at_least)
    # Reach back to the question the oldest answer replies to, when it is loaded.
    while start > 0 and start < len(turns) and turns[start].role != "user":
        start -= 1
    return turns[start:]


@dataclass(frozen=True, kw_only=True)
class SlidingWindow:
    """The last ``recent_turns`` turns verbatim, nothing else (a sliding window)."""

    recent_turns: int = 8
    name: str = "window"
    key_moment_limit: int = 0

    def plan(self, state: SessionState, message: str, *, now: datetime) -> MemoryPlan:
        return MemoryPlan(
            recent=_tail(state.turns, self.recent_turns), shares={"constraints": 200, "recent": 5700}
        )


@dataclass(frozen=True, kw_only=True)
class TokenWindow:
    """As many of the newest turns as the budget holds (up to what the loader provides)."""

    recent_turns: int = 200
    name: str = "token_window"
    key_moment_limit: int = 0

    def plan(self, state: SessionState, message: str, *, now: datetime) -> MemoryPlan:
        return MemoryPlan(recent=tuple(state.turns), shares={"constraints": 200, "recent": 5700})


@dataclass(frozen=True, kw_only=True)
class SlidingSummary:
    """The summary plus the turns it does not cover (at least the last ``recent_turns``).

    With ``recent_turns=2`` this is summary compression (summary + the
    last exchange); with 8 it is the default sliding summary.
    """

    recent_turns: int = 8
    name: str = "sliding_summary"
    key_moment_limit: int = 0

    def plan(self, state: SessionState, message: str, *, now: datetime) -> MemoryPlan:
        return MemoryPlan(
            recent=uncovered(state, self.recent_turns),
            summary=state.summary,
            shares=_FIXED_LAYER_SHARES,
        )


@dataclass(frozen=True, kw_only=True)
class Hybrid:
    """Recent window + key moments + summary, shared 60 / 25 / 15.

    Key moments are turns older than the recent window with emotion intensity
    above ``threshold``, ranked by intensity × time decay (an emotion loses half
    its weight every ``half_life_hours``), at most ``max_key_moments``.
    """

    recent_turns: int = 20
    threshold: float = 0.7
    max_key_moments: int = 5
    half_life_hours: float = 72.0
    name: str = "hybrid"
    shares: Mapping[LayerName, float] = field(
        default_factory=lambda: {"recent": 0.60, "key_moments": 0.25, "summary": 0.15}
    )

    @property
    def key_moment_limit(self) -> int:
        # Fetch more than we keep, so the time decay can reorder them.
        return self.max_key_moments * 4

    def rank_key_moments(
        self, candidates: Sequence[Turn], *, before_seq: int, now: datetime
    ) -> list[Turn]:
        """Key moments older than ``before_seq``, strongest decayed intensity first."""

        def weight(turn: Turn) -> float:
            age_h = max(0.0, (now - turn.created_at).total_seconds() / 3600)
            decay: float = 0.5 ** (age_h / self.half_life_hours)
            return (turn.emotion or 0.0) * decay

        eligible = [
            t for t in candidates
            if t.seq < before_seq and t.emotion is not None and t.emotion > self.threshold
        ]
        eligible.sort(key=lambda t: (-weight(t), -t.seq))
        return eligible[: self.max_key_moments]

    def plan(self, state: SessionState, message: str, *, now: datetime) -> MemoryPlan:
        not_covered = uncovered(state, self.recent_turns)
        # The window is the last N turns (design article 001); an emotional turn older than that is a
        # key moment even while the summary lags behind, and is not repeated among the recent.
        window = _tail(state.turns, self.recent_turns)
        first_window = window[0].seq if window else state.last_seq + 1
        pool = list(state.key_moments) + [t for t in state.turns if t.seq < first_window]
        unique = {t.seq: t for t in pool}
        moments = self.rank_key_moments(list(unique.values()), before_seq=first_window, now=now)
        shown = {t.seq for t in moments}
        recent = [t for t in not_covered if t.seq not in shown]
        return MemoryPlan(
            recent=recent, summary=state.summary, key_moments=moments, shares=self.shares
        )


STRATEGIES: dict[str, Callable[[], Strategy]] = {
    "window": SlidingWindow,
    "token_window": TokenWindow,
    "summary": lambda: SlidingSummary(recent_turns=2, name="summary"),
    "sliding_summary": SlidingSummary,
    "hybrid": Hybrid,
}
"""Strategy name → factory with the default settings."""


def register_strategy(name: str, factory: Callable[[], Strategy]) -> None:
    """Make a strategy available by name (used by extensions such as recall)."""
    STRATEGIES[name] = factory


def get_strategy(name_or_strategy: str | Strategy) -> Strategy:
    """A strategy by registry name, or the strategy itself."""
    if not isinstance(name_or_strategy, str):
        return name_or_strategy
    try:
        return STRATEGIES[name_or_strategy]()
    except KeyError:
        raise ConfigError(
            f"unknown strategy {name_or_strategy!r}; choose one of {', '.join(sorted(STRATEGIES))}"
        ) from None
