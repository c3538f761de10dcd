"""Memory: token budgets and the strategies that choose candidates for each layer."""

from .budget import FLEXIBLE_LAYERS, LAYER_NAMES, Budget, LayerName, allocate
from .recall import (
    DefaultStrategy,
    HybridRecall,
    Recaller,
    RecallSettings,
    register_recall_strategies,
)
from .strategies import (
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

register_recall_strategies()  # the one place the recall strategies are registered

__all__ = [
    "FLEXIBLE_LAYERS",
    "LAYER_NAMES",
    "STRATEGIES",
    "Budget",
    "DefaultStrategy",
    "Hybrid",
    "HybridRecall",
    "LayerName",
    "MemoryPlan",
    "RecallSettings",
    "Recaller",
    "SlidingSummary",
    "SlidingWindow",
    "Strategy",
    "TokenWindow",
    "allocate",
    "get_strategy",
    "register_strategy",
]
