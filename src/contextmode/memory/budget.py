"""Token budgets: the input budget, per-layer shares, and budget that flows between layers.

The context-manager design gives fixed allocations (window 8192, a quarter reserved for the
reply, system 300 / profile 200 / recent 4000 / summary 1500); the emotional-companion design gives
ratios (recent 60 %, key moments 25 %, summary 15 %). Either way, budget a layer
does not use flows to the layers that want more (a short conversation gives
everything to the recent turns; no key moments gives their share away).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from ..errors import ConfigError

__all__ = [
    "CONSTRAINTS_MAX_SHARE",
    "FLEXIBLE_LAYERS",
    "LAYER_NAMES",
    "Budget",
    "LayerName",
    "allocate",
]

LayerName = Literal[
    "system", "constraints", "summary", "key_moments", "recall", "recent", "hint", "current", "format"
]
LAYER_NAMES: tuple[LayerName, ...] = (
    "system", "constraints", "summary", "key_moments", "recall", "recent", "hint", "current", "format"
)
FLEXIBLE_LAYERS: tuple[LayerName, ...] = ("constraints", "recent", "summary", "key_moments", "recall")
"""Layers that share the budget, in the order that receives leftover tokens first
(pinned constraints are small and always wanted, then the newest turns)."""
CONSTRAINTS_MAX_SHARE = 0.25
"""Without a fixed allocation, pinned constraints take at most this share of the flexible budget
(or their weighted share if larger); the newest are kept when they do not all fit."""


@dataclass(frozen=True, kw_only=True)
class Budget:
    """How many tokens the model may receive and how they are shared.

    Give ``allocations`` (fixed tokens per layer) or ``shares``
    (weights per layer); with neither, the strategy's default shares
    apply. ``system``, ``current`` and ``format`` are always included whole.
    """

    context_window: int = 8192
    """The model's context window, tokens."""
    reply_reserve: int | None = None
    """Tokens kept free for the reply; ``None`` = a quarter of the window."""
    allocations: Mapping[LayerName, int] = field(default_factory=dict)
    """Fixed tokens per layer (caps before flowing)."""
    shares: Mapping[LayerName, float] = field(default_factory=dict)
    """Relative weights per flexible layer."""

    def __post_init__(self) -> None:
        if self.context_window <= 0:
            raise ConfigError(f"context_window must be positive, got {self.context_window}")
        if self.reply_reserve is not None and not 0 <= self.reply_reserve < self.context_window:
            raise ConfigError("reply_reserve must be between 0 and the context window")
        if self.allocations and self.shares:
            raise ConfigError("give a Budget either allocations or shares, not both")
        if any(v < 0 for v in self.allocations.values()) or any(
            v < 0 for v in self.shares.values()
        ):
            raise ConfigError("budget allocations and shares must not be negative")

    @property
    def reserve(self) -> int:
        """Tokens reserved for the reply."""
        return self.context_window // 4 if self.reply_reserve is None else self.reply_reserve

    @property
    def input_tokens(self) -> int:
        """Tokens available for everything the model receives."""
        return self.context_window - self.reserve

    @classmethod
    def fixed_layers(cls, context_window: int = 8192) -> Budget:
        """Fixed tokens per layer: system 300, profile 200, recent 4000, summary 1500, with a
        quarter of the window kept for the reply (the context-manager design)."""
        return cls(
            context_window=context_window,
            allocations={"system": 300, "constraints": 200, "recent": 4000, "summary": 1500},
        )

    @classmethod
    def emotion_window(cls, total_tokens: int = 6000) -> Budget:
        """Shares for an emotional companion over ``total_tokens`` of input: recent turns 60 %,
        key moments 25 %, summary 15 % (the emotional-companion design)."""
        return cls(
            context_window=total_tokens,
            reply_reserve=0,
            shares={"recent": 0.60, "key_moments": 0.25, "summary": 0.15},
        )

    @classmethod
    def seed003(cls, context_window: int = 8192) -> Budget:
        """Deprecated alias of `fixed_layers` (removed in the next release)."""
        warnings.warn("Budget.seed003() is deprecated; use Budget.fixed_layers()", DeprecationWarning, stacklevel=2)
        return cls.fixed_layers(context_window)

    @classmethod
    def seed001(cls, total_tokens: int = 6000) -> Budget:
        """Deprecated alias of `emotion_window` (removed in the next release)."""
        warnings.warn("Budget.seed001() is deprecated; use Budget.emotion_window()", DeprecationWarning, stacklevel=2)
        return cls.emotion_window(total_tokens)

    def with_total(self, input_tokens: int) -> Budget:
        """The same sharing with exactly ``input_tokens`` of input and no reply reserve."""
        return Budget(
            context_window=input_tokens,
            reply_reserve=0,
            allocations=self.allocations,
            shares=self.shares,
        )


def allocate(
    available: int,
    demands: Mapping[LayerName, int],
    *,
    caps: Mapping[LayerName, int] | None = None,
    weights: Mapping[LayerName, float] | None = None,
    optional_pins: int = 0,
) -> dict[LayerName, int]:
    """Split ``available`` tokens among flexible layers by water-filling.

    ``demands`` is what each layer could use. With ``caps`` (fixed allocations)
    each layer starts at its cap (scaled down if the caps exceed ``available``);
    with ``weights`` each starts at its weighted share. Then every token a
    layer does not need flows to the layers still wanting more, in proportion
    to their weights (caps act as weights), until nothing is left or nobody
    wants more. The result never exceeds ``available`` in total, nor any
    layer's demand.

    ``optional_pins``: the part of the constraints' demand that does not come first (pinned
    facts that recall can bring back verbatim when they matter, see `_constraints_first`).
    """
    layers = [name for name in FLEXIBLE_LAYERS if name in demands]
    if available <= 0 or not layers:
        return {name: 0 for name in layers}
    raw = _raw_weights(layers, caps, weights)
    if "constraints" in layers:
        return _constraints_first(available, demands, raw, caps=caps, weights=weights, optional=optional_pins)
    if caps:
        scale = min(1.0, available / max(1.0, sum(raw.values())))
        alloc = {name: int(raw[name] * scale) for name in layers}
    else:
        total_w = sum(raw.values())
        alloc = {name: int(available * raw[name] / total_w) for name in layers}
    _water_fill(alloc, available - sum(alloc.values()), demands, raw)
    return {name: min(alloc[name], demands[name]) for name in layers}


def _raw_weights(
    layers: list[LayerName], caps: Mapping[LayerName, int] | None, weights: Mapping[LayerName, float] | None
) -> dict[LayerName, float]:
    """Each layer's starting weight: its cap, else its weight; all equal when none is positive."""
    if caps:
        raw = {name: float(caps.get(name, 0)) for name in layers}
    else:
        raw = {name: float((weights or {}).get(name, 0.0)) for name in layers}
    if sum(raw.values()) <= 0:
        raw = {name: 1.0 for name in layers}
    return raw


def _constraints_first(
    available: int,
    demands: Mapping[LayerName, int],
    raw: Mapping[LayerName, float],
    *,
    caps: Mapping[LayerName, int] | None,
    weights: Mapping[LayerName, float] | None,
    optional: int = 0,
) -> dict[LayerName, int]:
    """Pinned constraints come first (design article 003 puts them near the top because they
    must not be lost): their whole demand, within their cap when one is set. A long list must
    not crowd out the conversation: without a fixed allocation the pinned layer takes at most
    its weighted share or a quarter, whichever is larger. The rest is allocated to the others.

    Without a fixed allocation, the ``optional`` part of the demand (pinned facts, as opposed
    to preferences, hard constraints and identity) comes first only within the layer's
    weighted share; beyond it, it takes only budget no other layer wants."""
    if caps:
        limit = caps.get("constraints", available)
        pinned = min(demands["constraints"], limit, available)
    else:
        total_w = sum(raw.values()) or 1.0
        limit = int(available * max(raw["constraints"] / total_w, CONSTRAINTS_MAX_SHARE))
        optional = max(0, min(optional, demands["constraints"]))
        pinned = min(demands["constraints"] - optional, limit, available)
        share = int(available * raw["constraints"] / total_w)
        pinned += max(0, min(optional, share - pinned, available - pinned))
    rest_caps: dict[LayerName, int] | None = {n: v for n, v in caps.items() if n != "constraints"} if caps else None
    rest = allocate(
        available - pinned, {n: demands[n] for n in raw if n != "constraints"}, caps=rest_caps, weights=weights
    )
    if not caps:
        # Budget nobody else wanted still flows to constraints beyond their share.
        spare = available - pinned - sum(rest.values())
        pinned += max(0, min(spare, demands["constraints"] - pinned))
    return {"constraints": pinned, **rest}


def _water_fill(
    alloc: dict[LayerName, int], pool: int, demands: Mapping[LayerName, int], raw: Mapping[LayerName, float]
) -> None:
    """Give back what a layer cannot use, share the pool among the hungry in proportion to
    their weights (``alloc`` changed in place)."""
    base = {name: (w if w > 0 else 1e-6) for name, w in raw.items()}
    layers = list(alloc)
    for _ in range(len(layers) + 2):
        for name in layers:
            extra = alloc[name] - demands[name]
            if extra > 0:
                alloc[name] -= extra
                pool += extra
        hungry = [n for n in layers if demands[n] > alloc[n]]
        if pool <= 0 or not hungry:
            return
        total_w = sum(base[n] for n in hungry)
        given = 0
        for name in hungry:
            share = int(pool * base[name] / total_w)
            alloc[name] += share
            given += share
        pool = _give_remainder(alloc, pool - given, hungry, demands)


def _give_remainder(alloc: dict[LayerName, int], pool: int, hungry: list[LayerName], demands: Mapping[LayerName, int]) -> int:
    """Integer remainders go to the hungry layers in priority order; returns what is left."""
    for name in hungry:
        if pool <= 0:
            break
        want = demands[name] - alloc[name]
        if want > 0:
            step = min(want, pool)
            alloc[name] += step
            pool -= step
    return pool
