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

__all__ = ["analyse", "jieba", "pos_tags", "search_words", "words"]


@lru_cache(maxsize=1)
def jieba() -> ModuleType:
    """The jieba module, its loading chatter silenced.

    Imported lazily, and only the cutter: its dictionary loads on the first cut (about
    0.3 s), the part-of-speech tagger (`pos_tags`) and the keyword extractor (`analyse`)
    only when asked for (as long again each), so a context that only cuts words never
    pays for them.
    """
    module = importlib.import_module("jieba")
    module.setLogLevel(logging.WARNING)
    return module


@lru_cache(maxsize=1)
def analyse() -> ModuleType:
    """``jieba.analyse`` (TF-IDF keywords), loaded on first use."""
    jieba()
    return importlib.import_module("jieba.analyse")


@lru_cache(maxsize=1)
def _posseg() -> ModuleType:
    jieba()
    return importlib.import_module("jieba.posseg")


def pos_tags(text: str) -> tuple[tuple[str, str], ...]:
    """jieba ``(word, POS flag)`` pairs of ``text``, whitespace included (offsets stay exact)."""
    return tuple((w, f) for w, f in _posseg().lcut(text))


def words(text: str, *, hmm: bool = True) -> tuple[str, ...]:
    """jieba words of ``text`` in order, whitespace included (``hmm=False``: dictionary words only)."""
    return tuple(jieba().lcut(text, HMM=hmm))


def search_words(text: str) -> tuple[str, ...]:
    """jieba's search-mode words of ``text`` (long words and their sub-words), blanks dropped."""
    return tuple(w for w in jieba().cut_for_search(text) if w.strip())
