"""Text: the ground floor every other layer stands on.

Language detection (`is_chinese`, `detect_language`), tokenisation (jieba words and
part-of-speech tags for Chinese, cached per text) and the per-text `TextAnalysis`
shared by the detector, rewriter, extractor, emotion scorer, summariser and recall.
Nothing here imports another part of context-mode: models, processors, memory and
assembly import this package, never the other way round.
"""

from .analysis import TextAnalysis, analyze_text
from .lang import Language, cjk_ratio, detect_language, is_chinese
from .tokens import jieba, keywords, pos_tags, search_words, tokenizer, words

__all__ = [
    "Language",
    "TextAnalysis",
    "analyze_text",
    "cjk_ratio",
    "detect_language",
    "is_chinese",
    "jieba",
    "keywords",
    "pos_tags",
    "search_words",
    "tokenizer",
    "words",
]
