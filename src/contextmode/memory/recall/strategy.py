"""The recall strategies: ``default`` (shipped), ``steady`` (the prompt-cache preset) and ``hybrid_recall``.

``hybrid_recall`` is the ``hybrid`` strategy plus a recall layer.

Layers: a short recent window (the last ``recent_turns`` turns), the summary,
key moments, and the older turns a `Recaller` found relevant to the message
(``SessionState.recalled``, best first). The recent window is deliberately
short: turns between the summary's coverage and the window are not lost, they
are reachable through recall when they matter, which spends the budget on
what the message is about rather than on whatever was said last.

Default shares: recall 0.60, recent 0.20, summary 0.10, key moments 0.05,
constraints 0.05 (pinned constraints get a share of their own, as a short user
profile would, so a long list of extracted facts cannot crowd out
everything else).
Shares are starting points: what a layer does not need (a short recent window,
no key moments, nothing recalled) flows to the others (`memory.budget.allocate`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from ...types import SessionState, Turn
from ..budget import LayerName
from ..strategies import Hybrid, MemoryPlan, register_strategy, uncovered

__all__ = ["DefaultStrategy", "HybridRecall", "SteadyStrategy", "register_recall_strategies"]

_MAX_RECENT = 200
"""The recent window's demand never grows past the turns a plain load returns (the store's
``max_uncovered``): turns loaded for budget left idle are backfill, not demand."""


def _window(turns: Sequence[Turn], n: int) -> tuple[Turn, ...]:
    """The last ``n`` turns, grown back to the question the oldest of them answers (a turn
    whose answer was never stored shifts the alternation): the window opens with the user."""
    if n <= 0:
        return ()
    start = max(0, len(turns) - n)
    while start > 0 and turns[start].role != "user":
        start -= 1
    return tuple(turns[start:])


@dataclass(frozen=True, kw_only=True)
class HybridRecall(Hybrid):
    """Recent window + summary + key moments + recalled turns (see the module docstring)."""

    recent_turns: int = 6
    max_key_moments: int = 3
    recall_limit: int = 128
    """How many recalled turns (hits and neighbours) the engine asks the recaller for."""
    name: str = "hybrid_recall"
    shares: Mapping[LayerName, float] = field(
        default_factory=lambda: {
            "recall": 0.60,
            "recent": 0.20,
            "summary": 0.10,
            "key_moments": 0.05,
            "constraints": 0.05,
        }
    )

    def plan(self, state: SessionState, message: str, *, now: datetime) -> MemoryPlan:
        recent = _window(state.turns, self.recent_turns)
        first_recent = recent[0].seq if recent else state.last_seq + 1
        # Loaded key moments carry their emotion score; they win over the same turn in the tail.
        pool = {t.seq: t for t in (*state.turns, *state.key_moments) if t.seq < first_recent}
        moments = self.rank_key_moments(list(pool.values()), before_seq=first_recent, now=now)
        # A key moment stays a recall candidate too: the assembler shows it once, in the key
        # moments when their share holds it, else where recall ranks it (never nowhere).
        recall = tuple(t for t in state.recalled if t.seq < first_recent)
        return MemoryPlan(
            recent=recent,
            summary=state.summary,
            key_moments=moments,
            recall=recall,
            shares=self.shares,
        )


@dataclass(frozen=True, kw_only=True)
class DefaultStrategy(HybridRecall):
    """The shipped default (``default``): `HybridRecall` whose recent layer can grow back.

    The recent window (the last ``recent_turns`` turns) always comes first; the
    turns before it that the summary does not cover yet follow as further
    recent candidates (oldest dropped first). When nothing older is relevant to
    the message, the recall layer asks for nothing and its share flows to those
    turns, so the context is then what ``sliding_summary`` would give (summary
    + recent turns) plus pins and key moments. The recent layer
    stays one unbroken stretch of the log: the extension stops at a turn that
    recall or the key moments already show.
    """

    name: str = "default"
    max_key_moments: int = 0
    """Off in the shipped default: on LoCoMo dev the key-moment layer lowered evidence recall
    at 500 and 1,000 tokens (0.635 → 0.627, 0.770 → 0.766) and the offline emotion scorer does
    not hold on unseen conversations (docs/quality.md), so its share goes to recall. The
    ``hybrid`` and ``hybrid_recall`` presets keep key moments for companion apps."""

    def plan(self, state: SessionState, message: str, *, now: datetime) -> MemoryPlan:
        base = super().plan(state, message, now=now)
        first_recent = base.recent[0].seq if base.recent else state.last_seq + 1
        shown = {t.seq for t in (*base.recall, *base.key_moments)}
        covers = state.summary_covers_seq
        older: list[Turn] = []
        # Walk back from the window while the turns are contiguous, uncovered and not
        # shown in another layer: the recent layer stays one unbroken stretch of the log.
        for turn in reversed(state.turns):
            if turn.seq >= first_recent:
                continue
            if turn.seq <= covers or turn.seq in shown or turn.seq != first_recent - len(older) - 1 \
                    or len(older) + len(base.recent) >= _MAX_RECENT:
                break
            older.append(turn)
        recent = (*reversed(older), *base.recent)
        first = recent[0].seq if recent else state.last_seq + 1
        backfill = tuple(t for t in reversed(state.turns) if t.seq < first)
        return replace(base, recent=recent, backfill=backfill)


@dataclass(frozen=True, kw_only=True)
class SteadyStrategy(DefaultStrategy):
    """The default with a request prefix that stays the same from turn to turn, for prompt caches
    (docs/caching.md). The window holds every turn the summary does not cover, and its budget
    depends neither on the message nor on what recall finds; once those turns no longer fit, it
    drops a block of its oldest ones at once, and the summary folds them in (it is not due by
    count before ``summary_keeps`` turns are left out): the pins, the summary and the window
    change together, once in many turns. Pins said inside the window are left to it. Recall and
    key moments come after the window and take at most ``volatile_max_tokens``."""

    name: str = "steady"
    volatile_max_tokens: int | None = 800
    summary_keeps: int = 190
    """Newest turns the summary leaves to the window when it is due by count: below what a load
    returns (200), so the window can hold every turn not summarised yet."""

    def plan(self, state: SessionState, message: str, *, now: datetime) -> MemoryPlan:
        window = uncovered(state, self.recent_turns)
        return replace(super().plan(state, message, now=now), steady_from=window[0].seq if window else None,
                       volatile_max_tokens=self.volatile_max_tokens)


def register_recall_strategies() -> None:
    """Make ``hybrid_recall`` and the shipped ``default`` available by name.

    Called once, by `contextmode.memory` when it is imported; importing this module
    registers nothing.
    """
    register_strategy("hybrid_recall", HybridRecall)
    register_strategy("default", DefaultStrategy)
    register_strategy("steady", SteadyStrategy)
