"""Choose the counter for a model name: its family's exact tokenizer, else a labelled estimate.

``counter_for_model("gpt-4o")`` → o200k_base, ``"gpt-4"`` → cl100k_base,
``"qwen2.5-72b-instruct"`` / ``"Qwen/Qwen3-8B"`` → qwen2, ``"deepseek-chat"`` /
``"deepseek-reasoner"`` → deepseek_v3, anything else → ``estimate:generic``.
``CONTEXTMODE_TOKENIZER`` overrides the choice for every model. Counters are built
once per process (a vocabulary loads in 0.2-0.5 s) and wrapped in an LRU cache.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable
from functools import cache
from typing import Final

from ..errors import ConfigError
from ._vocab import VocabularyUnavailable
from .base import TokenCounter
from .cached import CachedCounter
from .estimate import ESTIMATE_FAMILIES, EstimateCounter
from .hf_counter import load_deepseek_v3_counter
from .tiktoken_counter import load_openai_counter, load_qwen2_counter

__all__ = [
    "ENV_TOKENIZER",
    "EXACT_ENCODINGS",
    "counter_for_encoding",
    "counter_for_model",
    "encoding_for_model",
]

logger = logging.getLogger(__name__)

ENV_TOKENIZER: Final = "CONTEXTMODE_TOKENIZER"
"""Env var naming the encoding to use whatever the model (``o200k_base``, ``estimate:qwen2``…)."""

_LOADERS: Final[dict[str, Callable[[], TokenCounter]]] = {
    "o200k_base": lambda: load_openai_counter("o200k_base"),
    "cl100k_base": lambda: load_openai_counter("cl100k_base"),
    "qwen2": load_qwen2_counter,
    "deepseek_v3": load_deepseek_v3_counter,
}
EXACT_ENCODINGS: Final = tuple(_LOADERS)
"""Encodings counted exactly, from vocabularies shipped in installed packages."""

# First match wins; patterns see the lower-cased last path segment of the name
# ("Qwen/Qwen3-8B" → "qwen3-8b"), without an Ollama-style ":tag".
_RULES: Final[tuple[tuple[re.Pattern[str], str], ...]] = tuple(
    (re.compile(pattern), encoding)
    for pattern, encoding in (
        (
            r"^(gpt-4o|chatgpt-4o|gpt-4\.1|gpt-4\.5|gpt-5|gpt-oss|o\d|codex-|omni-moderation)",
            "o200k_base",
        ),
        (r"^(gpt-4|gpt-3\.5|gpt-35|text-embedding-ada-002|text-embedding-3)", "cl100k_base"),
        # R1 distilled into Qwen keeps Qwen's vocabulary; into Llama, neither family's.
        (r"^deepseek-r1-distill-qwen", "qwen2"),
        (r"^deepseek-r1-distill", "estimate:generic"),
        (r"^deepseek-(chat|reasoner|v3|r1|v4)", "deepseek_v3"),
        (r"^deepseek", "estimate:deepseek_v3"),
        # Qwen3.5/3.6 moved to a 248k vocabulary we have not verified: estimate.
        (r"^qwen(3\.[5-9]|[4-9])", "estimate:qwen2"),
        (r"^(qwen|qwq|qvq)", "qwen2"),
    )
)
# Ollama's deepseek-r1:<size> tags other than 671b are distilled models.
_OLLAMA_R1_QWEN_SIZES: Final = frozenset({"1.5b", "7b", "14b", "32b"})


def encoding_for_model(model: str | None) -> str:
    """The encoding for a model name: an exact one, or ``estimate:<family>``.

    Ignores ``CONTEXTMODE_TOKENIZER``; ``counter_for_model`` applies it.
    """
    if not model or not model.strip():
        return "estimate:generic"
    name = model.strip().lower().rsplit("/", 1)[-1]
    name, _, tag = name.partition(":")
    if name == "deepseek-r1" and tag and tag not in {"671b", "latest"}:
        return "qwen2" if tag in _OLLAMA_R1_QWEN_SIZES else "estimate:generic"
    for pattern, encoding in _RULES:
        if pattern.match(name):
            return encoding
    return "estimate:generic"


def _valid_names() -> list[str]:
    return [*EXACT_ENCODINGS, "estimate", *(f"estimate:{f}" for f in ESTIMATE_FAMILIES)]


_warned: set[str] = set()
_warned_lock = threading.Lock()


def _warn_once(key: str, message: str, *args: object) -> None:
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    logger.warning(message, *args)


@cache
def counter_for_encoding(name: str) -> TokenCounter:
    """The (process-wide, cached) counter for an encoding name, see ``EXACT_ENCODINGS``.

    ``estimate`` or ``estimate:<family>`` gives the estimator. If an exact vocabulary
    cannot be loaded, the family's estimate is returned and a warning logged once.
    """
    if name == "estimate":
        name = "estimate:generic"
    family = name.removeprefix("estimate:")
    if name.startswith("estimate:"):
        if family not in ESTIMATE_FAMILIES:
            raise ConfigError(f"unknown tokenizer {name!r}; use one of {_valid_names()}")
        return CachedCounter(EstimateCounter(family))
    loader = _LOADERS.get(name)
    if loader is None:
        raise ConfigError(f"unknown tokenizer {name!r}; use one of {_valid_names()}")
    try:
        return CachedCounter(loader())
    except VocabularyUnavailable as exc:
        _warn_once(
            f"unavailable:{name}",
            "exact tokenizer %s unavailable (%s); falling back to an estimate",
            name,
            exc,
        )
        return CachedCounter(EstimateCounter(name))


def counter_for_model(model: str | None) -> TokenCounter:
    """The counter for the configured model, honouring ``CONTEXTMODE_TOKENIZER``.

    Unknown models get ``estimate:generic`` (``exact`` False, logged once).
    """
    override = os.environ.get(ENV_TOKENIZER, "").strip()
    if override and override.lower() != "auto":
        return counter_for_encoding(override)
    encoding = encoding_for_model(model)
    if encoding.startswith("estimate:"):
        _warn_once(
            f"model:{model}",
            "no exact tokenizer known for model %r; token counts are estimates (%s)",
            model,
            encoding,
        )
    return counter_for_encoding(encoding)
