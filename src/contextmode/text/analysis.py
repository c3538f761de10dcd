"""`TextAnalysis`: what the layers read of one text, computed once per text.

The detector, rewriter, constraint extractor, emotion scorer, summariser and recall
all read the same turn texts: the message of this turn, and the earlier turns again
as its context. `analyze_text` returns one frozen `TextAnalysis` per text from a
bounded cache; each of its parts (language, jieba words, POS tags) is computed the
first time a layer asks for it, so an English text never loads jieba and a Chinese
one is cut once per process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TypeVar

from . import tokens
from .lang import Language, detect_language, is_chinese

__all__ = ["CACHE_SIZE", "TextAnalysis", "analyze_text"]

T = TypeVar("T")

CACHE_SIZE = 4096
"""Texts whose analysis is kept (turns recur as context of later turns)."""


@dataclass(frozen=True, eq=False)
class TextAnalysis:
    """One text's language and tokens; each part computed on first use, then kept."""

    text: str
    _parts: dict[str, object] = field(default_factory=dict, init=False, repr=False, compare=False)

    def _part(self, name: str, compute: Callable[[str], T]) -> T:
        # No lock (functools.cached_property takes one shared by all instances in 3.11):
        # two threads computing the same part at once both get equal values.
        try:
            return self._parts[name]  # type: ignore[return-value]
        except KeyError:
            value = self._parts[name] = compute(self.text)
            return value

    @property
    def chinese(self) -> bool:
        """At least one CJK character (`is_chinese`)."""
        return self._part("chinese", is_chinese)

    @property
    def language(self) -> Language:
        """``zh`` or ``en`` by the share of CJK letters (`detect_language`)."""
        return self._part("language", detect_language)

    @property
    def pos(self) -> tuple[tuple[str, str], ...]:
        """jieba ``(word, POS flag)`` pairs, whitespace included."""
        return self._part("pos", tokens.pos_tags)

    @property
    def tagged(self) -> tuple[tuple[str, str], ...]:
        """`pos` without the whitespace-only words."""
        return self._part("tagged", lambda _: tuple((w, f) for w, f in self.pos if w.strip()))

    @property
    def tagged_words(self) -> frozenset[str]:
        """The words of `tagged` longer than one character, as a set."""
        return self._part("tagged_words", lambda _: frozenset(w for w, _ in self.tagged if len(w) > 1))

    @property
    def words(self) -> tuple[str, ...]:
        """jieba words (default mode), whitespace-only words dropped."""
        return self._part("words", lambda t: tuple(w for w in tokens.words(t) if w.strip()))

    @property
    def dictionary_words(self) -> tuple[str, ...]:
        """jieba words without its HMM guesses for unknown words, whitespace included."""
        return self._part("dictionary_words", lambda t: tokens.words(t, hmm=False))

    @property
    def search_words(self) -> tuple[str, ...]:
        """jieba search-mode words (long words and their sub-words), blanks dropped."""
        return self._part("search_words", tokens.search_words)


@lru_cache(maxsize=CACHE_SIZE)
def analyze_text(text: str) -> TextAnalysis:
    """The shared analysis of ``text`` (the same object while ``text`` stays in the cache)."""
    return TextAnalysis(text)
