"""Index terms for recall: one token stream for Chinese and English.

The in-process index (`memory.recall`) and a store's postings (`store.postings`) count
a turn's terms with the same functions (`analyze`, `turn_counts`), from this layer below
both.

Chinese runs go through jieba's search mode (``cut_for_search``), which emits
the long words *and* their shorter dictionary sub-words, so "我妹妹" matches
"妹妹"; character bigrams of each run are added so that names jieba does not
know still match. Latin text is lower-cased, split into words and numbers, stripped of
stop words and lightly stemmed (plural, -ing, -ed, trailing -e), which is
enough for conversational English where Porter's deeper rules buy little.
Dates and numbers are kept as tokens: "2022", "may" and "8" are what temporal
questions match on.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache

from ..types import Turn
from .tokens import search_words

__all__ = [
    "CHINESE_STOPWORDS",
    "ENGLISH_STOPWORDS",
    "MAX_TERM_CHARS",
    "PREVIOUS_WEIGHT",
    "analyze",
    "indexed",
    "stem",
    "turn_counts",
    "turn_text",
    "unique_terms",
]

_RUNS = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]+|[a-z0-9]+(?:'[a-z]+)?")
_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")

ENGLISH_STOPWORDS = frozenset(
    ["a", "about", "above", "after", "again", "against", "all", "am", "an", "and", "any", "are", "as", "at", "be", "because", "been", "before", "being", "below", "between", "both", "but", "by", "can", "could", "did", "do", "does", "doing", "down", "during", "each", "few", "for", "from", "further", "had", "has", "have", "having", "he", "her", "here", "hers", "herself", "him", "himself", "his", "how", "i", "if", "in", "into", "is", "it", "its", "itself", "just", "me", "more", "most", "my", "myself", "no", "nor", "not", "now", "of", "off", "on", "once", "only", "or", "other", "our", "ours", "ourselves", "out", "over", "own", "same", "she", "should", "so", "some", "such", "than", "that", "the", "their", "theirs", "them", "themselves", "then", "there", "these", "they", "this", "those", "through", "to", "too", "under", "until", "up", "very", "was", "we", "were", "what", "when", "where", "which", "while", "who", "whom", "why", "will", "with", "would", "you", "your", "yours", "yourself", "yourselves", "yeah", "yes", "oh", "wow", "hey", "hi", "hello", "really", "thanks", "thank", "also", "got", "get", "gets", "getting", "lot", "lots", "much", "many", "like", "im", "ive", "id", "dont", "thats", "its", "youre", "it's", "i'm", "i've", "that's", "you're", "don't", "did", "didn't", "can't", "wasn't", "isn't"]
)
"""Function words and chat fillers that carry no topic (lower-case)."""

CHINESE_STOPWORDS = frozenset(
    ["的", "了", "是", "在", "和", "就", "都", "而", "及", "与", "着", "或", "一个", "没有", "我们", "你们", "他们", "她们", "这", "那", "这个", "那个", "吗", "呢", "吧", "啊", "呀", "哦", "嗯", "么", "什么", "怎么", "为什么", "哪", "哪里", "哪个", "来着", "一下", "有", "也", "还", "又", "把", "被", "让", "给", "对", "从", "到", "说", "要", "会", "能", "想", "很", "太", "更", "就是", "还是", "可以", "一些", "一点", "这样", "那样", "然后", "因为", "所以", "但是", "如果", "你", "我", "他", "她", "它", "，", "。", "？", "！"]
)
"""Function words and question particles (kept out of the index and the query)."""

_SUFFIXES_KEEP = ("ss", "us", "is")

MAX_TERM_CHARS = 64
"""Longest index term: a longer run (a base64 blob, a URL, a hash list) is indexed, and
searched, by its first 64 characters, so no backend's index refuses it (PostgreSQL's
B-tree rows stop near 2,700 bytes)."""

PREVIOUS_WEIGHT = 0.5
"""How much each word of the turn before counts in a turn's index entry (document
expansion; the default of `memory.recall.index.BM25Params.previous_weight`, and the
weight a store's postings are written with)."""


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """A light English stemmer: possessive, plural, -ing, -ed, final -e (cached)."""
    if word.endswith("'s"):
        word = word[:-2]
    if "'" in word:
        word = word.replace("'", "")
    if len(word) <= 3 or word.isdigit():
        return word
    if word.endswith("ies") and len(word) > 4:
        word = word[:-3] + "y"
    elif word.endswith("sses"):
        word = word[:-2]
    elif word.endswith("s") and not word.endswith(_SUFFIXES_KEEP):
        word = word[:-1]
    for suffix in ("ing", "ed"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            # "running" -> "runn" -> "run", "stopped" -> "stopp" -> "stop"
            if len(word) > 3 and word[-1] == word[-2] and word[-1] not in "lsz":
                word = word[:-1]
            break
    if word.endswith("e") and len(word) > 3:
        # "bake", "baked", "baking" all meet at "bak"
        word = word[:-1]
    if word.endswith("y") and len(word) > 3:
        # "happy"/"happiness" style pairs are rare enough; "study"/"studied" are not
        word = word[:-1] + "i"
    return word


def analyze(text: str) -> list[str]:
    """Index terms of ``text`` in order, repeats kept (for term frequencies).

    Cached per text: a turn is analysed when it is indexed, again as query expansion
    for the turns after it and by the recall explanation.
    """
    return list(_terms(text))


@lru_cache(maxsize=8192)
def _terms(text: str) -> tuple[str, ...]:
    terms: list[str] = []
    for match in _RUNS.finditer(text.lower()):
        run = match.group()
        if _CJK.match(run):
            words = [w[:MAX_TERM_CHARS] for w in search_words(run) if w not in CHINESE_STOPWORDS]
            terms.extend(words)
            # Character bigrams across the run: jieba glues unknown names to their verb
            # ("叫小红"), and the question splits differently ("叫什么"); bigrams still
            # meet ("妹叫", "小红"), which is the usual remedy in Chinese retrieval.
            have = set(words)
            terms.extend(
                bigram
                for bigram in (run[i : i + 2] for i in range(len(run) - 1))
                if bigram not in have and bigram not in CHINESE_STOPWORDS
            )
        elif run not in ENGLISH_STOPWORDS:
            stemmed = stem(run[:MAX_TERM_CHARS])
            if stemmed and stemmed not in ENGLISH_STOPWORDS:
                terms.append(stemmed)
    return tuple(terms)


def unique_terms(texts: Iterable[str]) -> set[str]:
    """All distinct terms of several texts."""
    seen: set[str] = set()
    for text in texts:
        seen.update(analyze(text))
    return seen


def indexed(turn: Turn) -> bool:
    """Whether recall indexes ``turn``: not the system prompt, not an engine notice
    (``Turn.notice``: the offline responder's text never feeds memory)."""
    return turn.role != "system" and not turn.notice


def turn_text(turn: Turn) -> str:
    """What is indexed of a turn: its content plus the speaker's name when known."""
    speaker = turn.metadata.get("speaker")
    return f"{speaker} {turn.content}" if isinstance(speaker, str) else turn.content


def turn_counts(
    turn: Turn,
    previous_terms: Sequence[str],
    previous_weight: float,
    analyzer: Callable[[str], list[str]] = analyze,
) -> tuple[dict[str, float], list[str]]:
    """A turn's indexed term frequencies, and the terms it passes on to the next turn.

    Its content terms, the speaker's name when known (the same terms as analysing
    `turn_text`), and ``previous_terms`` (the turn before's own words) counting
    ``previous_weight`` each (document expansion, `BM25Params.previous_weight`).
    Only the turn's own words pass on: expansion reaches one turn back, no further.
    Every index (in memory or in a store) counts a turn with this one function.
    """
    content_terms = analyzer(turn.content)
    counts: dict[str, float] = dict(Counter(content_terms))
    speaker = turn.metadata.get("speaker")
    if isinstance(speaker, str):
        for term in analyzer(speaker):
            counts[term] = counts.get(term, 0.0) + 1.0
    if previous_weight > 0:
        for term in previous_terms:
            counts[term] = counts.get(term, 0.0) + previous_weight
    return counts, content_terms
