"""A script-aware token estimate for models whose tokenizer we cannot run.

``len(text) / 4`` is an English rule of thumb: a Chinese character costs 0.6-1.3
tokens depending on the vocabulary, an English word about one, a digit up to one.
So the estimate counts pieces by script (Han characters, ASCII words and their
length, digit runs and digits, punctuation runs…) and weighs each by a coefficient
fitted per tokenizer family against the exact tokenizer on half of the evaluation
data (``python -m contextmode.tokens.evaluate DATA --fit``); ``docs/tokens.md``
reports the error on the other half. Every estimate says so: ``exact`` is False and
the first use of each family logs a warning.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Final

import regex

__all__ = [
    "ESTIMATE_FAMILIES",
    "EstimateCoefficients",
    "EstimateCounter",
    "ScriptCounts",
    "script_counts",
]

logger = logging.getLogger(__name__)

# One alternative per script class; ``regex`` for \p{Han} and friends.
_PIECE = regex.compile(
    r"(?P<han>\p{Han})"
    r"|(?P<kana>[\p{Hiragana}\p{Katakana}\p{Hangul}])"
    r"|(?P<word>[A-Za-z]+)"
    r"|(?P<number>\p{N}+)"
    r"|(?P<other_letters>[\p{L}\p{M}])"
    r"|(?P<cjk_punct>[\u3000-\u303f\uff00-\uffef\u2018-\u201f\u2026])"
    r"|(?P<newline>\s*[\r\n]\s*)"
    r"|(?P<space>\s+)"
    r"|(?P<punct>[\x21-\x2f\x3a-\x40\x5b-\x60\x7b-\x7e]+)"
    r"|(?P<other>.)",
    regex.DOTALL,
)

_LONG_WORD = 6
"""ASCII letters beyond this many in one word usually start another token."""


@dataclass(frozen=True, kw_only=True)
class ScriptCounts:
    """How many pieces of each script class a text has (all counts, not tokens)."""

    han: int = 0
    """Han characters."""
    words: int = 0
    """Runs of ASCII letters."""
    long_word_letters: int = 0
    """ASCII letters beyond the sixth in each word."""
    capitalized_words: int = 0
    """ASCII words starting with a capital (names and titles split into more tokens)."""
    numbers: int = 0
    """Runs of digits."""
    digits: int = 0
    """Digits in all runs."""
    punct_runs: int = 0
    """Runs of ASCII punctuation and symbols."""
    punct_chars: int = 0
    """ASCII punctuation and symbol characters."""
    kana: int = 0
    """Kana and Hangul characters."""
    other_letters: int = 0
    """Letters and marks outside ASCII and CJK (accents, Cyrillic…)."""
    cjk_punct: int = 0
    """Full-width and CJK punctuation characters, curly quotes, ellipses."""
    newlines: int = 0
    """Runs of whitespace containing a line break."""
    extra_spaces: int = 0
    """Spaces beyond the first of a run (the first one joins the next word)."""
    other: int = 0
    """Anything else (emoji, rare symbols)."""


def script_counts(text: str) -> ScriptCounts:
    """Count the script classes of ``text`` in one regex pass."""
    counts = dict.fromkeys((f.name for f in fields(ScriptCounts)), 0)
    for match in _PIECE.finditer(text):
        kind = match.lastgroup
        piece = match.group()
        if kind == "word":
            counts["words"] += 1
            counts["long_word_letters"] += max(0, len(piece) - _LONG_WORD)
            counts["capitalized_words"] += piece[0].isupper()
        elif kind == "number":
            counts["numbers"] += 1
            counts["digits"] += len(piece)
        elif kind == "punct":
            counts["punct_runs"] += 1
            counts["punct_chars"] += len(piece)
        elif kind == "space":
            counts["extra_spaces"] += len(piece) - 1
        elif kind == "newline":
            counts["newlines"] += 1
        elif kind is not None:
            counts[kind] += 1
    return ScriptCounts(**counts)


@dataclass(frozen=True, kw_only=True)
class EstimateCoefficients:
    """Tokens per piece for the classes common enough in the data to be fitted."""

    han: float
    words: float
    long_word_letters: float
    capitalized_words: float
    numbers: float
    digits: float
    punct_runs: float
    punct_chars: float


FITTED: Final = (
    "han",
    "words",
    "long_word_letters",
    "capitalized_words",
    "numbers",
    "digits",
    "punct_runs",
    "punct_chars",
)
"""The ``ScriptCounts`` fields whose weight is fitted per family."""

# Classes too rare in the evaluation data to fit (a few hundred pieces in 180k
# texts); their weights come from how byte-level BPE vocabularies treat them.
FIXED_WEIGHTS: Final[Mapping[str, float]] = MappingProxyType(
    {
        "kana": 1.0,
        "other_letters": 0.6,
        "cjk_punct": 1.0,
        "newlines": 1.0,
        "extra_spaces": 0.3,
        "other": 2.0,
    }
)

# Fitted by `python -m contextmode.tokens.evaluate DATA --fit` (weighted least
# squares on relative error, fit half of every dataset); "generic" is fitted to the
# largest count among the four exact tokenizers, so unknown models are over- rather
# than under-counted.
_COEFFICIENTS: Final[dict[str, EstimateCoefficients]] = {
    "o200k_base": EstimateCoefficients(
        han=0.835,
        words=0.988,
        long_word_letters=0.083,
        capitalized_words=0.353,
        numbers=0.869,
        digits=0.349,
        punct_runs=0.004,
        punct_chars=0.399,
    ),
    "cl100k_base": EstimateCoefficients(
        han=1.33,
        words=0.986,
        long_word_letters=0.077,
        capitalized_words=0.32,
        numbers=0.45,
        digits=0.418,
        punct_runs=0.383,
        punct_chars=0.287,
    ),
    "qwen2": EstimateCoefficients(
        han=0.653,
        words=0.988,
        long_word_letters=0.075,
        capitalized_words=0.307,
        numbers=0.499,
        digits=1.025,
        punct_runs=0.346,
        punct_chars=0.314,
    ),
    "deepseek_v3": EstimateCoefficients(
        han=0.603,
        words=0.99,
        long_word_letters=0.073,
        capitalized_words=0.321,
        numbers=1.02,
        digits=0.291,
        punct_runs=0.31,
        punct_chars=0.351,
    ),
    "generic": EstimateCoefficients(
        han=1.328,
        words=0.987,
        long_word_letters=0.083,
        capitalized_words=0.351,
        numbers=-0.184,
        digits=0.981,
        punct_runs=0.34,
        punct_chars=0.328,
    ),
}

# (per-role message overhead, reply overhead) of each family's chat template, the
# same figures the exact counters compute from their vocabularies.
_OVERHEADS: Final[dict[str, tuple[Mapping[str, int], int]]] = {
    "o200k_base": ({"system": 3, "user": 3, "assistant": 3}, 3),
    "cl100k_base": ({"system": 3, "user": 3, "assistant": 3}, 3),
    "qwen2": ({"system": 5, "user": 5, "assistant": 5}, 3),
    "deepseek_v3": ({"system": 0, "user": 1, "assistant": 2}, 2),
    "generic": ({"system": 5, "user": 5, "assistant": 5}, 3),
}

ESTIMATE_FAMILIES: Final = tuple(_COEFFICIENTS)
"""Families the estimator is calibrated for: the four exact encodings and ``generic``."""

_warned: set[str] = set()
_warned_lock = threading.Lock()


class EstimateCounter:
    """Estimated token counts (``exact = False``) calibrated against one tokenizer family.

    ``family`` is an encoding name (``o200k_base``, ``cl100k_base``, ``qwen2``,
    ``deepseek_v3``) or ``generic`` for an unknown model. A non-empty text is at
    least one token.
    """

    exact = False

    def __init__(
        self, family: str = "generic", *, coefficients: EstimateCoefficients | None = None, quiet: bool = False
    ) -> None:
        """``quiet``: no warning that counts are estimates (a measure kept on the side, not the
        engine's counter)."""
        if family not in _COEFFICIENTS and coefficients is None:
            raise ValueError(f"unknown estimate family {family!r}; use one of {ESTIMATE_FAMILIES}")
        self.family = family
        self.name = f"estimate:{family}"
        self.coefficients = coefficients or _COEFFICIENTS[family]
        roles, reply = _OVERHEADS.get(family, _OVERHEADS["generic"])
        self.role_overheads: Mapping[str, int] = MappingProxyType(dict(roles))
        self.message_overhead: int = max(roles.values())
        self.reply_overhead: int = reply
        self._weights = {name: getattr(self.coefficients, name) for name in FITTED}
        self._weights.update(FIXED_WEIGHTS)
        with _warned_lock:
            first = not quiet and self.name not in _warned
            if not quiet:
                _warned.add(self.name)
        if first:
            logger.warning(
                "token counts for %s are ESTIMATES (exact=False): no exact tokenizer in use",
                self.name,
            )

    def estimate(self, text: str) -> float:
        """Unrounded estimate of the tokens of ``text``."""
        counts = script_counts(text)
        total: float = sum(weight * getattr(counts, name) for name, weight in self._weights.items())
        return total

    def count(self, text: str) -> int:
        """Estimated tokens of ``text`` alone: the rounded estimate, at least 1 if non-empty."""
        if not text:
            return 0
        return max(1, round(self.estimate(text)))

    def __repr__(self) -> str:
        return f"EstimateCounter({self.family!r})"
