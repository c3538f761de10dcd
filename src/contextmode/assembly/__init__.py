"""Assembly: fit memory into a token budget and render it for the model."""

from .adapters import to_anthropic, to_messages, to_text
from .assemble import (
    ORDER_PRESETS,
    AssemblyConfig,
    CurrentTurn,
    assemble,
    cut_to_tokens,
    order_preset,
)
from .context import Context, LayerAccount, LayerContent, LayerItem, PromptFormat

__all__ = [
    "ORDER_PRESETS",
    "AssemblyConfig",
    "Context",
    "CurrentTurn",
    "LayerAccount",
    "LayerContent",
    "LayerItem",
    "PromptFormat",
    "assemble",
    "cut_to_tokens",
    "order_preset",
    "to_anthropic",
    "to_messages",
    "to_text",
]
