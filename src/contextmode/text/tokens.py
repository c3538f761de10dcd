"""jieba tokenisation: the three cuts the processors and recall use.

These functions cut every time they are called; callers go through
`contextmode.text.analyze_text`, which caches one `TextAnalysis` per text so a
text is cut once per process whichever layer asks.
"""

from __future__ import annotations

import copy
import importlib
import logging
from functools import lru_cache
from types import ModuleType
from typing import Any

__all__ = ["jieba", "keywords", "pos_tags", "search_words", "tokenizer", "words"]


@lru_cache(maxsize=1)
def jieba() -> ModuleType:
    """The jieba module, its loading chatter silenced (imported on first use)."""
    module = importlib.import_module("jieba")
    module.setLogLevel(logging.WARNING)
    return module


@lru_cache(maxsize=1)
def tokenizer() -> Any:
    """The project's jieba tokenizer: jieba's default dictionary read a first character at a
    time (`jieba_dict.BucketedTokenizer`), so a text is cut after reading the entries of its
    own characters only, not the whole 500,000-entry prefix dictionary (0.3-0.7 s). The
    part-of-speech tagger (`pos_tags`) and the keyword extractor (`keywords`) load when first
    asked for, so a context that only cuts words never pays for them."""
    jieba()
    from .jieba_dict import BucketedTokenizer

    return BucketedTokenizer()


@lru_cache(maxsize=1)
def _posseg() -> Any:
    """jieba's POS tagger over `tokenizer`, sharing the word-tag table jieba read at import."""
    posseg = importlib.import_module("jieba.posseg")
    tagger = object.__new__(posseg.POSTokenizer)  # its __init__ would read dict.txt a second time
    tagger.tokenizer = tokenizer()
    tagger.word_tag_tab = posseg.dt.word_tag_tab
    return tagger


@lru_cache(maxsize=1)
def _tfidf() -> Any:
    """jieba's TF-IDF keyword extractor (its IDF table) over `tokenizer` and `_posseg`."""
    default = importlib.import_module("jieba.analyse").default_tfidf
    extractor = copy.copy(default)
    extractor.tokenizer, extractor.postokenizer = tokenizer(), _posseg()
    return extractor


def keywords(text: str, top: int) -> tuple[str, ...]:
    """jieba's ``top`` TF-IDF keywords of ``text``, best first."""
    return tuple(_tfidf().extract_tags(text, topK=top))


def pos_tags(text: str) -> tuple[tuple[str, str], ...]:
    """jieba ``(word, POS flag)`` pairs of ``text``, whitespace included (offsets stay exact)."""
    return tuple((w, f) for w, f in _posseg().lcut(text))


def words(text: str, *, hmm: bool = True) -> tuple[str, ...]:
    """jieba words of ``text`` in order, whitespace included (``hmm=False``: dictionary words only)."""
    return tuple(tokenizer().lcut(text, HMM=hmm))


def search_words(text: str) -> tuple[str, ...]:
    """jieba's search-mode words of ``text`` (long words and their sub-words), blanks dropped."""
    return tuple(w for w in tokenizer().cut_for_search(text) if w.strip())
