"""Token counting: exact tokenizers per model family, and a script-aware estimator.

``counter_for_model(model)`` picks the counter; ``count_messages`` prices a chat request.
Vocabularies come from installed packages, never from the network (``docs/tokens.md``).
"""

from .base import RoleAwareCounter, TokenCounter
from .cached import CachedCounter
from .estimate import EstimateCounter
from .hf_counter import HFTokenizerCounter
from .registry import (
    ENV_TOKENIZER,
    EXACT_ENCODINGS,
    counter_for_encoding,
    counter_for_model,
    encoding_for_model,
)
from .tiktoken_counter import TiktokenCounter
from .tools import count_messages, count_turn

__all__ = [
    "ENV_TOKENIZER",
    "EXACT_ENCODINGS",
    "CachedCounter",
    "EstimateCounter",
    "HFTokenizerCounter",
    "RoleAwareCounter",
    "TiktokenCounter",
    "TokenCounter",
    "count_messages",
    "count_turn",
    "counter_for_encoding",
    "counter_for_model",
    "encoding_for_model",
]
