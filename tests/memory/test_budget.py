"""Budgets and water-filling: fixed allocations (seed 003), ratios (seed 001), budget that flows."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextmode.errors import ConfigError
from contextmode.memory import FLEXIBLE_LAYERS, Budget, LayerName, allocate

SEED001_WEIGHTS: dict[LayerName, float] = {"recent": 0.60, "key_moments": 0.25, "summary": 0.15}
SEED003_CAPS: dict[LayerName, int] = {"constraints": 200, "recent": 4000, "summary": 1500}


def test_default_budget_keeps_a_quarter_for_the_reply() -> None:
    budget = Budget()
    assert (budget.context_window, budget.reserve, budget.input_tokens) == (8192, 2048, 6144)
    assert Budget(context_window=1000, reply_reserve=100).input_tokens == 900
    assert Budget(context_window=1000, reply_reserve=0).input_tokens == 1000


def test_fixed_layers_allocations() -> None:
    budget = Budget.fixed_layers()
    assert budget.context_window == 8192 and budget.input_tokens == 6144
    assert dict(budget.allocations) == {
        "system": 300, "constraints": 200, "recent": 4000, "summary": 1500,
    }
    assert not budget.shares
    assert Budget.fixed_layers(16384).input_tokens == 12288


def test_emotion_window_ratios() -> None:
    budget = Budget.emotion_window()
    assert budget.input_tokens == 6000 and budget.reserve == 0
    assert dict(budget.shares) == SEED001_WEIGHTS
    assert not budget.allocations
    assert Budget.emotion_window(1200).input_tokens == 1200


def test_with_total_keeps_the_sharing() -> None:
    budget = Budget.fixed_layers().with_total(3000)
    assert (budget.input_tokens, budget.reserve) == (3000, 0)
    assert budget.allocations == Budget.fixed_layers().allocations


@pytest.mark.parametrize(
    "kwargs",
    [
        {"context_window": 0},
        {"context_window": -5},
        {"context_window": 100, "reply_reserve": 100},
        {"context_window": 100, "reply_reserve": -1},
        {"allocations": {"recent": 10}, "shares": {"recent": 1.0}},
        {"allocations": {"recent": -1}},
        {"shares": {"summary": -0.5}},
    ],
)
def test_invalid_budgets_are_config_errors(kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        Budget(**kwargs)


def test_allocate_nothing_to_share() -> None:
    assert allocate(1000, {}) == {}
    assert allocate(0, {"recent": 50, "summary": 10}) == {"recent": 0, "summary": 0}
    assert allocate(-3, {"recent": 50}) == {"recent": 0}


def test_allocate_seed001_ratios_when_every_layer_wants_more() -> None:
    demands: dict[LayerName, int] = {"recent": 10_000, "key_moments": 10_000, "summary": 10_000}
    alloc = allocate(6000, demands, weights=SEED001_WEIGHTS)
    assert alloc == {"recent": 3600, "key_moments": 1500, "summary": 900}


def test_allocate_short_conversation_gives_everything_to_recent() -> None:
    # Seed 001: under 20 turns there is no summary and no key moment; the window takes all.
    alloc = allocate(6000, {"recent": 9000, "key_moments": 0, "summary": 0}, weights=SEED001_WEIGHTS)
    assert alloc == {"recent": 6000, "key_moments": 0, "summary": 0}


def test_allocate_no_key_moments_gives_their_share_away() -> None:
    demands: dict[LayerName, int] = {"recent": 10_000, "key_moments": 0, "summary": 10_000}
    alloc = allocate(6000, demands, weights=SEED001_WEIGHTS)
    assert alloc["key_moments"] == 0
    assert sum(alloc.values()) == 6000
    assert alloc["recent"] > 3600 and alloc["summary"] > 900
    # The freed quarter flows in proportion to the remaining weights (60:15).
    assert alloc["recent"] == pytest.approx(4 * alloc["summary"], abs=2)


def test_allocate_unused_summary_flows_to_recent() -> None:
    alloc = allocate(1000, {"recent": 2000, "key_moments": 0, "summary": 100}, weights=SEED001_WEIGHTS)
    assert alloc == {"recent": 900, "summary": 100, "key_moments": 0}


def test_allocate_seed003_caps_then_flow() -> None:
    # Everyone hungry: the caps, then the surplus in proportion to them.
    alloc = allocate(5700, {"constraints": 10_000, "recent": 10_000, "summary": 10_000},
                     caps=SEED003_CAPS)
    assert alloc == {"constraints": 200, "recent": 4000, "summary": 1500}
    # Few constraints: their unused 150 tokens flow to recent and summary (4000:1500).
    alloc = allocate(5700, {"constraints": 50, "recent": 10_000, "summary": 10_000},
                     caps=SEED003_CAPS)
    assert alloc["constraints"] == 50
    assert sum(alloc.values()) == 5700
    assert alloc["recent"] - 4000 == pytest.approx(150 * 4000 / 5500, abs=2)
    # A short summary gives the rest to the recent turns.
    alloc = allocate(5700, {"constraints": 0, "recent": 10_000, "summary": 300}, caps=SEED003_CAPS)
    assert alloc == {"constraints": 0, "recent": 5400, "summary": 300}


def test_allocate_caps_are_scaled_down_when_they_exceed_what_is_available() -> None:
    alloc = allocate(2850, {"recent": 10_000, "summary": 10_000},
                     caps={"recent": 4000, "summary": 1500})
    assert sum(alloc.values()) == 2850
    assert alloc["recent"] == pytest.approx(2850 * 4000 / 5500, abs=2)


def test_allocate_constraints_come_first() -> None:
    alloc = allocate(100, {"constraints": 20, "recent": 500}, weights={"recent": 1.0})
    assert alloc == {"constraints": 20, "recent": 80}
    # A long list takes at most a quarter (or its weighted share) while others want more…
    alloc = allocate(100, {"constraints": 80, "recent": 500}, weights={"recent": 1.0})
    assert alloc == {"constraints": 25, "recent": 75}
    # …and whatever nobody else wants.
    alloc = allocate(100, {"constraints": 80, "recent": 10}, weights={"recent": 1.0})
    assert alloc == {"constraints": 80, "recent": 10}
    # Within their cap when one is set.
    alloc = allocate(1000, {"constraints": 500, "recent": 5000}, caps=SEED003_CAPS)
    assert alloc["constraints"] == 200


def test_allocate_layers_without_weight_still_get_leftovers() -> None:
    alloc = allocate(1000, {"recent": 100, "recall": 5000}, weights={"recent": 1.0})
    assert alloc == {"recent": 100, "recall": 900}


_demand = st.integers(min_value=0, max_value=20_000)


@settings(max_examples=300, deadline=None)
@given(
    available=st.integers(min_value=-10, max_value=20_000),
    demands=st.dictionaries(st.sampled_from(FLEXIBLE_LAYERS), _demand, max_size=5),
    mode=st.sampled_from(["weights", "caps", "none"]),
    numbers=st.lists(st.integers(min_value=0, max_value=5000), min_size=5, max_size=5),
)
def test_allocate_never_exceeds_and_wastes_nothing(
    available: int, demands: dict[LayerName, int], mode: str, numbers: list[int]
) -> None:
    weights = {n: float(v) for n, v in zip(FLEXIBLE_LAYERS, numbers, strict=True)}
    caps = dict(zip(FLEXIBLE_LAYERS, numbers, strict=True))
    alloc = allocate(
        available,
        demands,
        caps=caps if mode == "caps" else None,
        weights=weights if mode == "weights" else None,
    )
    assert set(alloc) == set(demands)
    assert all(0 <= alloc[n] <= demands[n] for n in demands)
    assert sum(alloc.values()) <= max(0, available)
    if mode == "caps" and "constraints" in demands:
        assert alloc["constraints"] <= caps["constraints"]
        # Constraints above their cap are left out on purpose; the rest is work-conserving.
        demands = {**demands, "constraints": alloc["constraints"]}
    # Budget flows: either every layer has what it wants or the budget is used up.
    assert sum(alloc.values()) == min(max(0, available), sum(demands.values()))


def test_old_preset_names_still_work_with_a_deprecation_warning() -> None:
    with pytest.warns(DeprecationWarning, match="fixed_layers"):
        assert Budget.seed003(16384) == Budget.fixed_layers(16384)
    with pytest.warns(DeprecationWarning, match="emotion_window"):
        assert Budget.seed001(1200) == Budget.emotion_window(1200)
    from contextmode.assembly import AssemblyConfig, order_preset

    with pytest.warns(DeprecationWarning, match="question_first"):
        assert AssemblyConfig(order="seed003").resolved_order() == order_preset("question_first")
    from contextmode.errors import ConfigError

    with pytest.raises(ConfigError, match="CONTEXTMODE_ORDER"):
        order_preset("seed002")
