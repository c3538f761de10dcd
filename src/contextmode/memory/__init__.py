"""Memory: token budgets and the strategies that choose candidates for each layer."""

from .budget import FLEXIBLE_LAYERS, LAYER_NAMES, Budget, LayerName, allocate
from .recall import Recaller, RecallSettings
from .recall_strategy import (  # importing registers default, hybrid_recall
    DefaultStrategy,
    HybridRecall,
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
