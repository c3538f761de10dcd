"""Token counting: exact tokenizers per model family, and a script-aware estimator."""

from .base import TokenCounter, count_messages

__all__ = ["TokenCounter", "count_messages"]
