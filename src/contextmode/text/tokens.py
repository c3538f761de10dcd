"""jieba tokenisation: the three cuts the processors and recall use.

These functions cut every time they are called; callers go through
`contextmode.text.analyze_text`, which caches one `TextAnalysis` per text so a
text is cut once per process whichever layer asks.
"""

from __future__ import annotations

import importlib
import logging
from functools import lru_cache
from types import ModuleType

__all__ = ["jieba", "pos_tags", "search_words", "words"]


@lru_cache(maxsize=1)
def jieba() -> ModuleType:
    """The jieba module with its part-of-speech tagger and keyword extractor loaded.

    Imported lazily: loading its dictionary takes about a second. Its loading chatter
    is silenced.
    """
    module = importlib.import_module("jieba")
    importlib.import_module("jieba.analyse")
    importlib.import_module("jieba.posseg")
    module.setLogLevel(logging.WARNING)
    return module


def pos_tags(text: str) -> tuple[tuple[str, str], ...]:
    """jieba ``(word, POS flag)`` pairs of ``text``, whitespace included (offsets stay exact)."""
    return tuple((w, f) for w, f in jieba().posseg.lcut(text))


def words(text: str, *, hmm: bool = True) -> tuple[str, ...]:
    """jieba words of ``text`` in order, whitespace included (``hmm=False``: dictionary words only)."""
    return tuple(jieba().lcut(text, HMM=hmm))


def search_words(text: str) -> tuple[str, ...]:
    """jieba's search-mode words of ``text`` (long words and their sub-words), blanks dropped."""
    return tuple(w for w in jieba().cut_for_search(text) if w.strip())
