"""Memory strategies: which stored material each one offers to each layer."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from contextmode.errors import ConfigError
from contextmode.memory import (
    STRATEGIES,
    Hybrid,
    MemoryPlan,
    SlidingSummary,
    SlidingWindow,
    Strategy,
    TokenWindow,
    get_strategy,
    register_strategy,
)
from contextmode.types import Role, SessionState, Summary, Turn

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def make_turn(seq: int, *, emotion: float | None = None, hours_ago: float = 0.0,
              role: Role | None = None) -> Turn:
    return Turn(
        seq=seq,
        role=role or ("user" if seq % 2 else "assistant"),
        content=f"turn {seq}",
        tokens=2,
        created_at=NOW - timedelta(hours=hours_ago),
        emotion=emotion,
    )


def make_state(n: int, *, covers: int = 0, first: int = 1, moments: tuple[Turn, ...] = (),
               emotions: dict[int, float] | None = None) -> SessionState:
    emotions = emotions or {}
    turns = tuple(make_turn(s, emotion=emotions.get(s), hours_ago=n - s) for s in range(first, n + 1))
    summary = Summary(text="前情提要", covers_seq=covers, tokens=4) if covers else None
    return SessionState(tenant="t", session_id="s", last_seq=n, turns=turns, summary=summary,
                        key_moments=moments)


def seqs(turns: object) -> list[int]:
    return [t.seq for t in turns]  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_strategy_handles_an_empty_history(name: str) -> None:
    plan = get_strategy(name).plan(make_state(0), "你好", now=NOW)
    assert isinstance(plan, MemoryPlan)
    assert (tuple(plan.recent), plan.summary, tuple(plan.key_moments), tuple(plan.recall)) == (
        (), None, (), ())


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_strategy_keeps_a_single_turn(name: str) -> None:
    plan = get_strategy(name).plan(make_state(1, emotions={1: 0.99}), "hi", now=NOW)
    assert seqs(plan.recent) == [1]
    assert tuple(plan.key_moments) == ()  # a turn in the window is not also a key moment


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_strategies_satisfy_the_protocol(name: str) -> None:
    strategy = get_strategy(name)
    assert isinstance(strategy, Strategy)
    assert strategy.name == name
    assert strategy.recent_turns > 0
    assert strategy.key_moment_limit >= 0


def test_window_is_the_last_n_turns() -> None:
    plan = SlidingWindow(recent_turns=8).plan(make_state(30, covers=25), "q", now=NOW)
    assert seqs(plan.recent) == list(range(23, 31))
    assert plan.summary is None  # the sliding window ignores the summary (seed 002)
    assert seqs(SlidingWindow(recent_turns=3).plan(make_state(2), "q", now=NOW).recent) == [1, 2]


def test_token_window_offers_every_loaded_turn() -> None:
    plan = TokenWindow().plan(make_state(50, first=11), "q", now=NOW)
    assert seqs(plan.recent) == list(range(11, 51))
    assert plan.summary is None


def test_sliding_summary_offers_the_uncovered_turns_and_at_least_n() -> None:
    strategy = SlidingSummary(recent_turns=8)
    plan = strategy.plan(make_state(30, covers=10, first=9), "q", now=NOW)
    assert seqs(plan.recent) == list(range(11, 31))
    assert plan.summary is not None and plan.summary.covers_seq == 10
    # The summary covers almost everything: still the last 8 verbatim.
    plan = strategy.plan(make_state(30, covers=28, first=23), "q", now=NOW)
    assert seqs(plan.recent) == list(range(23, 31))
    # No summary yet: every loaded turn is uncovered.
    assert seqs(strategy.plan(make_state(12), "q", now=NOW).recent) == list(range(1, 13))


def test_summary_strategy_is_summary_plus_last_exchange() -> None:
    strategy = get_strategy("summary")
    assert isinstance(strategy, SlidingSummary) and strategy.recent_turns == 2
    plan = strategy.plan(make_state(20, covers=20, first=15), "q", now=NOW)
    assert seqs(plan.recent) == [19, 20]
    assert plan.summary is not None


def test_hybrid_defaults_follow_seed001() -> None:
    hybrid = Hybrid()
    assert (hybrid.recent_turns, hybrid.threshold, hybrid.max_key_moments) == (20, 0.7, 5)
    assert dict(hybrid.shares) == {"recent": 0.60, "key_moments": 0.25, "summary": 0.15}
    assert hybrid.key_moment_limit >= hybrid.max_key_moments


def test_hybrid_key_moments_are_above_threshold_and_at_most_five() -> None:
    emotions = {2: 0.95, 3: 0.7, 4: 0.71, 5: 0.2, 6: 0.8, 7: 0.9, 8: 0.85, 9: 0.75, 35: 0.99}
    state = make_state(40, emotions=emotions)
    plan = Hybrid(half_life_hours=1e9).plan(state, "q", now=NOW)
    # No summary yet: every turn is uncovered, but the emotional ones older than the
    # 20-turn window are key moments (seed 001) and are not repeated among the recent.
    lagging = sorted(seqs(plan.key_moments))
    assert lagging == [2, 6, 7, 8, 9]
    assert seqs(plan.recent) == [s for s in range(1, 41) if s not in lagging]
    plan = Hybrid(half_life_hours=1e9).plan(make_state(40, covers=20, emotions=emotions), "q",
                                            now=NOW)
    assert seqs(plan.recent) == list(range(21, 41))
    moments = seqs(plan.key_moments)
    assert len(moments) == 5
    assert 3 not in moments and 5 not in moments  # 0.7 is not above the threshold
    assert moments == [2, 7, 8, 6, 9]  # strongest first
    assert 35 not in moments  # inside the recent window


def test_hybrid_key_moments_older_than_the_summary_are_kept() -> None:
    old = (make_turn(3, emotion=0.9, hours_ago=72), make_turn(7, emotion=0.8, hours_ago=60))
    state = make_state(60, covers=50, first=31, moments=old)
    plan = Hybrid().plan(state, "q", now=NOW)
    assert seqs(plan.recent) == list(range(41, 61))
    assert plan.summary is not None and plan.summary.covers_seq == 50
    assert sorted(seqs(plan.key_moments)) == [3, 7]


def test_hybrid_time_decay_prefers_recent_emotions() -> None:
    week_old = make_turn(2, emotion=0.95, hours_ago=24 * 7)
    hour_old = make_turn(4, emotion=0.8, hours_ago=1)
    hybrid = Hybrid(recent_turns=2)
    ranked = hybrid.rank_key_moments([week_old, hour_old], before_seq=10, now=NOW)
    assert seqs(ranked) == [4, 2]
    # Without decay (an endless half-life) the stronger one wins.
    ranked = Hybrid(half_life_hours=1e12).rank_key_moments([week_old, hour_old], before_seq=10,
                                                          now=NOW)
    assert seqs(ranked) == [2, 4]


def test_hybrid_deduplicates_moments_loaded_twice() -> None:
    moment = make_turn(25, emotion=0.9, hours_ago=20)
    state = make_state(50, covers=30, first=21, moments=(moment,), emotions={25: 0.9})
    plan = Hybrid().plan(state, "q", now=NOW)
    assert seqs(plan.key_moments) == [25]


def test_get_strategy_by_name_or_instance() -> None:
    assert get_strategy("sliding_summary") == SlidingSummary()
    custom = SlidingWindow(recent_turns=3)
    assert get_strategy(custom) is custom
    with pytest.raises(ConfigError, match=r"unknown strategy 'nope'.*hybrid"):
        get_strategy("nope")


def test_register_strategy() -> None:
    register_strategy("tiny_window", lambda: SlidingWindow(recent_turns=1, name="tiny_window"))
    try:
        plan = get_strategy("tiny_window").plan(make_state(5), "q", now=NOW)
        assert seqs(plan.recent) == [5]
    finally:
        del STRATEGIES["tiny_window"]
