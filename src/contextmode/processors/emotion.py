"""Offline emotion intensity: lexicons, a learned model, dialogue context, calibration.

Intensity is 0 (neutral) to 1 (overwhelming), whatever the sign of the feeling:
picks key moments by intensity > 0.7, so "我太开心了!!" and "我真的崩溃了" both count.

How a score is made:
1. Emotion words are found in the lexicon (``lexicons/{zh,en}_emotion.tsv``). Chinese is
   matched on the text and checked against jieba's word boundaries for one-character
   entries (so 气 counts in "别气了" but not in "天气"); English on words, with light
   suffix stripping (``worried`` → ``worry``).
2. Each word's weight is scaled by the modifiers just before it (太/非常/特别/真的/好,
   so/very/really; 有点/a bit lower it) and after it (死了/极了); a negation
   (不/没/别, not/never/n't) lowers it: much for negative words ("我不难过"), less for
   positive ones ("不开心" is still a feeling).
3. Words combine as a noisy-or (each adds part of what is left), then punctuation and
   typography add arousal: ``!``/``！``, repeated ``!!``/``??``, ``……``, capitals, stretched
   letters (``sooo``), crying emoticons. This is `analyze_lexicon`.
4. English: VADER (``vaderSentiment``, its own lexicon with negation, intensifier, caps
   and emoji rules) adds the distress of a negative compound valence as a noisy-or to
   the lexicon's intensity.
   Chinese: the shipped text model (`emotion_model`) reads character n-grams and the
   lexicon's verdict, because most emotional Chinese lines carry no emotion word
   ("撞你个头"); its logit goes through the context stage, which reads the logits of
   the turns before (``prior``: the mood of the conversation and the speaker's own
   baseline). Strong emotion words keep their lexicon intensity as a floor.
5. The logit is calibrated per language so that 0.7 means "strongly emotional": on dev
   data, the share of turns above 0.7 equals the share labelled strongly emotional.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from functools import cache, lru_cache
from typing import Protocol

from ..text import Language, analyze_text, detect_language
from ._hashed_model import logistic
from .base import ModelFree, PriorTurn
from .emotion_analysis import EmotionAnalysis, EmotionHit, emotion_level
from .emotion_model import (
    CONTEXT_WINDOW,
    Calibration,
    PriorLogit,
    load_emotion_model,
    logit,
    with_lexicon_floor,
)
from .lexicons import emotion_words, modifiers

__all__ = [
    "EmotionAnalysis",
    "EmotionHit",
    "OfflineEmotionScorer",
    "PriorTurn",
    "analyze_emotion",
    "analyze_lexicon",
    "emotion_level",
    "text_logit",
]

_NEGATED_NEGATIVE = 0.3
"""Weight kept by a negated negative word: "我不难过" still hints at the topic."""
_NEGATED_POSITIVE = 0.75
"""Weight kept by a negated positive word: "不开心" is a (sad) feeling of its own."""

_EN_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?")
_EN_CLAUSE = re.compile(r"[.!?;,:\n]+")
_ZH_CLAUSE = re.compile(r"[。！？；，、,.!?;\n]")
_CRY = re.compile(r"(T_T|QAQ|:\(|:'\(|555+|呜+|😭|😢|😡|😤|💔)")
_STRETCH = re.compile(r"([A-Za-z])\1{2,}")


@cache
def _zh_pattern() -> re.Pattern[str]:
    words = sorted(emotion_words("zh"), key=len, reverse=True)
    return re.compile("|".join(re.escape(w) for w in words))


@cache
def _zh_prefix_modifiers() -> list[str]:
    return sorted(modifiers("zh"), key=len, reverse=True)


_ZH_SUFFIX_MODIFIERS = ("死了", "极了", "透了", "坏了", "得不行", "要命")


_ZH_GLUE = frozenset("我你他她它们了的啊呀吧呢嘛哦")


def _token_spans(text: str) -> list[tuple[int, int]]:
    spans = []
    pos = 0
    for token in analyze_text(text).dictionary_words:
        spans.append((pos, pos + len(token)))
        pos += len(token)
    return spans


def _single_char_is_word(text: str, start: int, spans: list[tuple[int, int]]) -> bool:
    """True when a one-character entry stands as a word, not inside another (天气, 爱好)."""
    for tok_start, tok_end in spans:
        if tok_start <= start < tok_end:
            before, after = text[tok_start:start], text[start + 1 : tok_end]
            # jieba glues 有点烦 and 我爱你 into one token: the rest is a modifier or a pronoun.
            before_ok = not before or before in modifiers("zh") or set(before) <= _ZH_GLUE
            after_ok = not after or set(after) <= _ZH_GLUE
            return before_ok and after_ok
    return False


def _apply_modifiers(
    base: float, polarity: str, mods: list[tuple[str, float]]
) -> tuple[float, bool]:
    weight = base
    negated = False
    for kind, factor in mods:
        if kind == "negation":
            negated = not negated
        else:
            weight *= factor
    if negated:
        weight *= _NEGATED_POSITIVE if polarity == "+" else _NEGATED_NEGATIVE
    return min(weight, 1.0), negated


def _zh_hits(text: str) -> list[EmotionHit]:
    lexicon = emotion_words("zh")
    mods = modifiers("zh")
    spans: list[tuple[int, int]] | None = None
    hits: list[EmotionHit] = []
    for match in _zh_pattern().finditer(text):
        word = match.group()
        start, end = match.span()
        if len(word) == 1:
            # One character is often part of another word (天气, 爱好): keep it only
            # when jieba sees it as a word of its own.
            if spans is None:
                spans = _token_spans(text)
            if not _single_char_is_word(text, start, spans):
                continue
        clause_start = max(
            (m.end() for m in _ZH_CLAUSE.finditer(text, 0, start)), default=0
        )
        window = text[max(clause_start, start - 5) : start]
        found: list[tuple[str, float]] = []
        while window and len(found) < 3:
            for cand in _zh_prefix_modifiers():
                if window.endswith(cand):
                    found.append((mods[cand].kind, mods[cand].weight))
                    window = window[: -len(cand)]
                    break
            else:
                # 得/了/的 sit between a modifier and its word ("太让人难过了").
                if window[-1] in "的得地了让人我你他她":
                    window = window[:-1]
                    continue
                break
        tail = text[end : end + 3]
        for suffix in _ZH_SUFFIX_MODIFIERS:
            if tail.startswith(suffix):
                found.append(("intensifier", mods[suffix].weight if suffix in mods else 1.4))
                break
        entry = lexicon[word]
        weight, negated = _apply_modifiers(entry.intensity, entry.polarity, found)
        hits.append(
            EmotionHit(word=word, weight=weight, polarity=entry.polarity, negated=negated)
        )
    return hits


@lru_cache(maxsize=32768)
def _en_base(word: str) -> str | None:
    lexicon = emotion_words("en")
    if word in lexicon:
        return word
    squeezed = re.sub(r"(.)\1{2,}", r"\1\1", word)
    for cand in (squeezed, re.sub(r"(.)\1+", r"\1", word)):
        if cand in lexicon:
            return cand
    for suffix, repl in (
        ("ies", "y"), ("ied", "y"), ("ing", ""), ("ing", "e"), ("ed", ""), ("ed", "e"),
        ("es", ""), ("s", ""), ("ly", ""), ("d", ""), ("ness", ""), ("ful", ""),
    ):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            cand = word[: -len(suffix)] + repl
            if cand in lexicon:
                return cand
    return None


def _en_hits(text: str) -> list[EmotionHit]:
    lexicon = emotion_words("en")
    mods = modifiers("en")
    hits: list[EmotionHit] = []
    for clause in _EN_CLAUSE.split(text):
        words = [w.lower() for w in _EN_WORD.findall(clause)]
        for i, word in enumerate(words):
            base = _en_base(word)
            if base is None:
                continue
            found: list[tuple[str, float]] = []
            for prev in words[max(0, i - 3) : i]:
                mod = mods.get(prev) or mods.get(re.sub(r"(.)\1{2,}", r"\1", prev))
                if mod is None and prev.endswith("n't"):
                    mod = mods["n't"]
                if mod is not None:
                    found.append((mod.kind, mod.weight))
            entry = lexicon[base]
            weight, negated = _apply_modifiers(entry.intensity, entry.polarity, found)
            hits.append(
                EmotionHit(word=base, weight=weight, polarity=entry.polarity, negated=negated)
            )
    return hits


def _arousal(text: str, language: Language) -> float:
    """0–1 extra intensity from punctuation and typography."""
    score = 0.0
    exclaims = text.count("!") + text.count("！")
    if exclaims:
        score += 0.2 + 0.1 * min(exclaims - 1, 3)
    if re.search(r"[?？]{2,}|[!！][?？]|[?？][!！]", text):
        score += 0.15
    if re.search(r"\.{3,}|…|。{2,}", text):
        score += 0.08
    if _CRY.search(text):
        score += 0.35
    if language == "en":
        if re.search(r"\b[A-Z]{3,}\b", text) and not text.isupper():
            score += 0.15
        if _STRETCH.search(text):
            score += 0.1
    elif re.search(r"([\u4e00-\u9fff])\1{2,}", text):
        score += 0.1  # 啊啊啊, 哈哈哈
    return min(score, 0.8)


def analyze_lexicon(text: str) -> EmotionAnalysis:
    """Score ``text`` from the lexicon and punctuation only (steps 1–3, no model)."""
    language = detect_language(text)
    hits = _zh_hits(text) if language == "zh" else _en_hits(text)
    remaining = 1.0
    for hit in hits:
        remaining *= 1.0 - 0.85 * hit.weight
    lexical = 1.0 - remaining
    arousal = _arousal(text, language)
    intensity = 1.0 - (1.0 - lexical) * (1.0 - arousal)
    return EmotionAnalysis(
        intensity=round(min(max(intensity, 0.0), 1.0), 4), hits=tuple(hits), language=language
    )


class _Vader(Protocol):
    def polarity_scores(self, text: str) -> dict[str, float]: ...


@cache
def _vader() -> _Vader:
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    analyzer: _Vader = SentimentIntensityAnalyzer()
    return analyzer


def _en_raw(text: str, lexical: float) -> float:
    """Step 4 for English: noisy-or of the lexicon and VADER's negative valence."""
    distress = max(0.0, -_vader().polarity_scores(text)["compound"])
    return 1.0 - (1.0 - lexical) * (1.0 - distress)


@lru_cache(maxsize=4096)
def _zh_scored(text: str) -> tuple[float, EmotionAnalysis]:
    """A Chinese text's own logit and the lexicon's analysis it was read with (both are
    needed to score it: analysed once)."""
    model = load_emotion_model()
    lexical = analyze_lexicon(text)
    if model is None:
        return logit(lexical.intensity), lexical
    return model.text_logit(text, lexical), lexical


def _zh_text_logit(text: str) -> float:
    return _zh_scored(text)[0]


@lru_cache(maxsize=4096)
def text_logit(text: str) -> float:
    """The turn's own logit before context and calibration (cached: earlier turns repeat, as the
    context of each next turn's score)."""
    if detect_language(text) == "zh":
        return _zh_text_logit(text)
    return logit(_en_raw(text, analyze_lexicon(text).intensity))


def analyze_emotion(
    text: str, *, prior: Sequence[PriorTurn] = (), use_model: bool = True
) -> EmotionAnalysis:
    """Score ``text`` and say which words carried the feeling.

    ``prior`` are the turns before it, oldest first (Chinese reads the last
    `emotion_model.CONTEXT_WINDOW` of them). ``use_model=False`` keeps to the lexicon
    and punctuation (steps 1–3).
    """
    if not use_model or not text.strip():
        return analyze_lexicon(text)
    model = load_emotion_model()
    chinese = model is not None and detect_language(text) == "zh"
    own, lexical = _zh_scored(text) if chinese else (0.0, analyze_lexicon(text))
    calibration = model.calibration_for(lexical.language) if model is not None else Calibration()
    probability: float | None = None
    if chinese and model is not None:
        probability = round(logistic(own), 4)
        context = [PriorLogit(logit=text_logit(p.text), same_speaker=p.same_speaker)
                   for p in prior[-CONTEXT_WINDOW:] if p.text.strip()]
        z = model.context.logit(own, context)
        intensity = with_lexicon_floor(lexical.intensity, calibration(z))
    else:
        z = logit(_en_raw(text, lexical.intensity))
        intensity = calibration(z)
    return replace(
        lexical,
        intensity=round(intensity, 4),
        model_probability=probability,
        logit=round(z, 4),
    )


class OfflineEmotionScorer(ModelFree):
    """`EmotionScorer` from the bundled lexicons, VADER and the shipped model.

    Deterministic and offline; ``use_model=False`` keeps to the lexicon (steps 1–3).
    `score_in_context` also reads the turns before (the engine passes them).
    """

    def __init__(self, *, use_model: bool = True) -> None:
        self.use_model = use_model

    async def score(self, text: str) -> float:
        """Emotion intensity of ``text``, 0 (neutral) to 1 (overwhelming)."""
        return analyze_emotion(text, use_model=self.use_model).intensity

    async def score_in_context(self, text: str, prior: Sequence[PriorTurn]) -> float:
        """Intensity of ``text`` said after ``prior`` (oldest first)."""
        return analyze_emotion(text, prior=prior, use_model=self.use_model).intensity

    def score_sync(self, text: str, prior: Sequence[PriorTurn] = ()) -> float:
        """Same as `score_in_context`, for callers outside an event loop (evaluation, CLI)."""
        return analyze_emotion(text, prior=prior, use_model=self.use_model).intensity
