"""Offline context-dependence detector: does a message need earlier turns?

A message such as "举个例子", "那个按钮在哪?" or "what about the second one" only makes
sense with the turns before it; "北京今天天气怎么样" stands alone. The detector scores
a message with a small logistic regression over hashed features of the message and
its context, shipped as ``data/detector.json`` and trained by
``scripts/train_detector.py``. Inference is pure Python (a dictionary lookup per
feature), so no numeric library is needed at run time.

Features (all hashed into ``buckets`` slots with CRC-32, prefixed by language):

* the message itself: character 1–3-grams, jieba words and their POS tags (Chinese) or
  lower-cased words and bigrams (English), first/last characters or words, length;
* cues: pronouns and demonstratives, the follow-up intent over the last answer;
* its relation to the context: how many of its words/characters occur in the previous
  turn and in the whole context, nouns and verbs of the previous turn it leaves out,
  whether the previous turn was a question.

The keyword follow-up intents (`classify_follow_up_intent`) are kept: a detail, simplify,
example or summary intent over an existing answer always counts as needing context,
and `Detection.intent` carries the matched intent.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from ..text import analyze_text, is_chinese
from ..types import Turn
from ._hashed_model import feature_slots, hash_feature, logistic, pack_weights, unpack_weights
from .base import Detection, ModelFree
from .intents import classify_follow_up_intent

__all__ = [
    "CONTEXT_TURNS",
    "DEFAULT_MODEL_FILE",
    "UNSURE_BAND",
    "DetectorModel",
    "OfflineContextDetector",
    "context_features",
    "feature_slots",
    "hash_feature",
    "load_detector_model",
    "strong_cue",
    "sure_of",
]

DEFAULT_MODEL_FILE = "detector.json"
"""Name of the shipped model inside ``contextmode/processors/data``."""

CONTEXT_TURNS = 4
"""How many of the newest turns the features look at (Restoration-200K has four)."""

_ZH_PRONOUNS = ("它", "他", "她", "这个", "那个", "这些", "那些", "这样", "那样", "这里",
                "那里", "这儿", "那儿", "其", "该")
_ZH_QUESTION = ("什么", "怎么", "哪", "谁", "几", "多少", "吗", "么", "呢", "为何", "为什么",
                "?", "？")
_QUESTION_END = "吗呢吧么啊嘛？?"
_EN_PRONOUNS = frozenset(["it", "its", "they", "them", "their", "he", "him", "his", "she", "her", "this", "that", "these", "those", "one", "ones", "there", "then"])
_EN_CUES = ("what about", "how about", "and what", "what else", "the first", "the second",
            "the other", "the same", "also", "as well", "instead", "why not", "else")
_EN_STOP = frozenset(["a", "an", "the", "of", "to", "in", "on", "at", "for", "and", "or", "but", "is", "are", "was", "were", "be", "been", "do", "does", "did", "what", "who", "when", "where", "why", "how", "which", "with", "by", "from", "as", "that", "this", "it", "i", "you", "he", "she", "we", "they", "me", "my", "your", "his", "her", "our", "their"])
_EN_WORD = re.compile(r"[a-z0-9']+")

# Cues that decide on their own (measured on the dev data: 91% of Restoration-200K
# messages starting with 它/这个/那个 need context, 99% of CANARD questions with a
# third-person pronoun do). They catch clear follow-ups the statistical model, trained
# mostly on chit-chat, scores too low.
_ZH_LEADING_REFERENCE = ("它", "这个", "那个", "这些", "那些", "这种", "那种", "这款", "那款",
                         "第一个", "第二个", "第三个", "上面", "上述", "刚才", "前面")
_ZH_BARE_FOLLOW_UPS = frozenset(["为什么", "为啥", "怎么了", "真的吗", "然后呢", "后来呢", "然后", "比如呢", "比如", "还有呢", "还有吗", "还有别的吗", "其他呢", "别的呢", "怎么办", "为什么呢", "是吗", "哪个", "哪些"])
_ZH_WHAT_ABOUT = re.compile(r"^(那|那么|那要是|那如果|如果是|要是)[^，。,]{1,12}(呢|怎么样|如何)[?？]?$")
_EN_REFERENCE = re.compile(
    r"\b(it|its|he|him|his|she|her|hers|they|them|their|theirs|the (?:first|second|third|"
    r"last|other|former|latter) one|that one|this one|the same)\b")
_EN_WHAT_ABOUT = re.compile(r"^(what|how) about\b|^and\b|^(why|how|when|where|who)\b\W*$")


def _bucket(value: float, cuts: Sequence[float]) -> int:
    for i, cut in enumerate(cuts):
        if value <= cut:
            return i
    return len(cuts)


def _pos(text: str) -> tuple[tuple[str, str], ...]:
    """jieba (word, POS flag) pairs of ``text``, blanks dropped (the shared, cached analysis)."""
    return analyze_text(text).tagged


def _zh_features(message: str, context: Sequence[str]) -> list[str]:
    tagged = _pos(message)
    words = [w for w, _ in tagged]
    return [*_zh_message_features(message, tagged), *_zh_context_features(message, words, context)]


def _zh_message_features(message: str, tagged: Sequence[tuple[str, str]]) -> list[str]:
    """The message alone: characters, jieba words and tags, length, pronouns."""
    n = len(message)
    feats = [f"len:{_bucket(n, (1, 2, 3, 4, 5, 6, 8, 10, 13, 17, 22, 30))}"]
    for k in (1, 2, 3):
        feats.extend(f"c{k}:{message[i:i + k]}" for i in range(n - k + 1))
    if n:
        feats += [f"bos:{message[:2]}", f"eos:{message[-2:]}", f"b1:{message[0]}",
                  f"e1:{message[-1]}"]
    feats.extend(f"w:{w}" for w, _ in tagged)
    feats.extend(f"t:{t}" for _, t in tagged)
    feats.append("tg:" + "_".join(t for _, t in tagged[:2]))
    feats.append("tge:" + "_".join(t for _, t in tagged[-2:]))
    feats.append(f"nw:{_bucket(len(tagged), (1, 2, 3, 4, 6, 8, 12))}")
    feats.append(f"hasn:{int(any(t.startswith('n') or t == 'r' for _, t in tagged))}")
    feats.append(f"hasv:{int(any(t.startswith('v') for _, t in tagged))}")
    feats.extend("pron" for p in _ZH_PRONOUNS if p in message)
    return feats


def _zh_context_features(message: str, words: Sequence[str], context: Sequence[str]) -> list[str]:
    """The message against its context: shared words and characters, the previous turn."""
    prev = context[-1] if context else ""
    prev_tagged = _pos(prev) if prev else ()
    prev_words = {w for w, _ in prev_tagged if len(w) > 1}
    all_words = frozenset().union(*(analyze_text(text).tagged_words for text in context))
    long_words = [w for w in words if len(w) > 1]
    feats = [f"ovp:{_bucket(sum(w in prev_words for w in long_words), (0, 1, 2, 3))}"]
    shared = sum(w in all_words for w in long_words)
    feats.append(f"ova:{_bucket(shared, (0, 1, 2, 3))}")
    if long_words:
        feats.append(f"ovr:{_bucket(shared / len(long_words), (0, 0.2, 0.4, 0.6, 0.8))}")
    feats.extend(_zh_previous_features(message, prev, prev_tagged, prev_words))
    if len(context) >= 2 and message:
        before = context[-2]
        feats.append(f"ov2:{_bucket(_char_overlap(message, before), (0, .2, .4, .6))}")
    return feats


def _zh_previous_features(
    message: str, prev: str, prev_tagged: Sequence[tuple[str, str]], prev_words: set[str]
) -> list[str]:
    """The previous turn: overlap, length, a question, the nouns and verbs left out."""
    feats = []
    if message:
        feats.append(f"ovc:{_bucket(_char_overlap(message, prev), (0, .2, .4, .6, .8))}")
    feats.append(f"plen:{_bucket(len(prev), (2, 4, 6, 8, 12, 16, 24))}")
    if prev and prev[-1] in _QUESTION_END:
        feats.append("pq")
    if any(q in prev for q in _ZH_QUESTION):
        feats.append("pqw")
    if message and prev:
        feats.append(f"pe:{prev[-1]}|{message[0]}")
    feats.extend(f"pw:{w}" for w in prev_words)
    left_out_nouns = [w for w, t in prev_tagged if t.startswith("n") and w not in message]
    left_out_verbs = [w for w, t in prev_tagged if t.startswith("v") and w not in message]
    feats.append(f"pn:{_bucket(len(left_out_nouns), (0, 1, 2, 3))}")
    feats.append(f"pv:{_bucket(len(left_out_verbs), (0, 1, 2, 3))}")
    return feats


def _char_overlap(message: str, other: str) -> float:
    """Share of the message's characters that occur in ``other`` (``message`` not empty)."""
    return sum(ch in other for ch in message) / len(message)


def _en_features(message: str, context: Sequence[str]) -> list[str]:
    lowered = message.lower()
    words = _EN_WORD.findall(lowered)
    feats = [f"len:{_bucket(len(words), (1, 2, 3, 4, 5, 6, 8, 10, 14, 20))}"]
    feats.extend(f"w:{w}" for w in words)
    feats.extend(f"w2:{a}_{b}" for a, b in itertools.pairwise(words))
    if words:
        feats += [f"bos:{words[0]}", f"bos2:{'_'.join(words[:2])}", f"eos:{words[-1]}"]
    feats.extend("pron" for w in words if w in _EN_PRONOUNS)
    feats.extend(f"cue:{c}" for c in _EN_CUES if c in lowered)
    content = [w for w in words if w not in _EN_STOP]
    feats.append(f"nc:{_bucket(len(content), (0, 1, 2, 3, 5, 8))}")
    prev_words = set(_EN_WORD.findall(context[-1].lower())) - _EN_STOP if context else set()
    all_words = {w for t in context for w in _EN_WORD.findall(t.lower())} - _EN_STOP
    feats.append(f"ovp:{_bucket(sum(w in prev_words for w in content), (0, 1, 2, 3))}")
    shared = sum(w in all_words for w in content)
    feats.append(f"ova:{_bucket(shared, (0, 1, 2, 3))}")
    if content:
        feats.append(f"ovr:{_bucket(shared / len(content), (0, 0.2, 0.4, 0.6, 0.8))}")
    caps = re.findall(r"(?<!^)(?<![.?!] )\b[A-Z][a-z]+", message)
    feats.append(f"caps:{_bucket(len(caps), (0, 1, 2))}")
    feats.append(f"ctx:{_bucket(len(context), (0, 1, 2, 4))}")
    return feats


def strong_cue(message: str) -> str | None:
    """The decisive follow-up cue in ``message`` ("它…", "为什么", "what about…"), if any."""
    text = message.strip()
    bare = text.rstrip("?？!！。.~ ")
    if is_chinese(text):
        if text.startswith(_ZH_LEADING_REFERENCE):
            return "leading reference"
        if bare in _ZH_BARE_FOLLOW_UPS:
            return "bare follow-up"
        if _ZH_WHAT_ABOUT.match(text):
            return "what-about ellipsis"
        return None
    lowered = text.lower()
    if _EN_WHAT_ABOUT.search(lowered):
        return "what-about ellipsis"
    if _EN_REFERENCE.search(lowered):
        return "pronoun"
    if 0 < len(_EN_WORD.findall(lowered)) <= 3 and lowered.endswith("?"):
        return "bare follow-up"
    return None


def context_features(message: str, context: Sequence[str]) -> list[str]:
    """Feature names of ``message`` given ``context`` (turn texts, oldest first).

    Names are prefixed with the language (``zh:`` / ``en:``) so the two share one
    weight table without interfering. The training script and the detector both use
    this function, so a shipped model always matches the code that reads it.
    """
    message = message.strip()
    context = [c.strip() for c in context if c and c.strip()][-CONTEXT_TURNS:]
    lang = "zh" if is_chinese(message) else "en"
    raw = _zh_features(message, context) if lang == "zh" else _en_features(message, context)
    intent = classify_follow_up_intent(message)
    if intent is not None:
        raw.append(f"intent:{intent}")
    raw.append("bias")
    return [f"{lang}:{f}" for f in raw]


@dataclass(frozen=True, kw_only=True)
class DetectorModel:
    """Logistic-regression weights over hashed feature slots."""

    buckets: int
    """Number of hash slots."""
    weights: dict[int, float]
    """Non-zero weight per slot."""
    intercept: float
    """Bias term of the logistic regression."""
    threshold: float = 0.5
    """Probability at and above which a message counts as needing context."""
    info: dict[str, Any] | None = None
    """Training provenance (data, cross-validated figures), for humans."""

    def probability(self, message: str, context: Sequence[str]) -> float:
        """Probability 0–1 that ``message`` needs ``context``."""
        slots = feature_slots(context_features(message, context), self.buckets)
        return logistic(self.intercept + sum(self.weights.get(s, 0.0) for s in slots))

    def to_json(self) -> dict[str, Any]:
        """Compact JSON form: sorted slots and weights quantised to int16, zlib + base64."""
        return {
            "format": "contextmode-detector/1",
            "buckets": self.buckets,
            "intercept": self.intercept,
            "threshold": self.threshold,
            **pack_weights(self.weights),
            "info": self.info or {},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DetectorModel:
        """Inverse of `to_json`."""
        return cls(
            buckets=int(data["buckets"]),
            weights=unpack_weights(data),
            intercept=float(data["intercept"]),
            threshold=float(data.get("threshold", 0.5)),
            info=data.get("info") or {},
        )


@lru_cache(maxsize=4)
def load_detector_model(path: str | None = None) -> DetectorModel:
    """The model at ``path``, or the one shipped with the package when ``None``."""
    if path is None:
        text = resources.files("contextmode.processors").joinpath("data", DEFAULT_MODEL_FILE)
        return DetectorModel.from_json(json.loads(text.read_text(encoding="utf-8")))
    return DetectorModel.from_json(json.loads(Path(path).read_text(encoding="utf-8")))


UNSURE_BAND: tuple[float, float] = (0.3, 0.7)
"""Probabilities of the shipped model, from the lower bound up to (not including) the upper, at
which the detector is unsure (`Detection.sure` False), so a cascade asks a model. Out-of-fold
on the dev data (``scripts/train_detector.py --bands``), see docs/models.md."""


def sure_of(score: float, *, cued: bool, unsure: tuple[float, float] = UNSURE_BAND) -> bool:
    """Whether the model's probability ``score`` decides a message without a template intent:
    at the ``unsure`` band's upper bound and above, or below its lower bound with no follow-up
    cue (``cued``: a cue on a message the model finds standalone is a disagreement)."""
    low, high = unsure
    return score >= high or (score < low and not cued)


class OfflineContextDetector(ModelFree):
    """`ContextDetector` backed by the shipped model and the keyword follow-up intents.

    A verdict is `Detection.sure` when a template intent ("give me an example") decided it, or
    when the model's probability is outside ``unsure`` (`UNSURE_BAND`) and no cue contradicts it
    (a follow-up cue on a message the model finds standalone is a disagreement: unsure)."""

    def __init__(self, model: DetectorModel | None = None, *, threshold: float | None = None,
                 unsure: tuple[float, float] = UNSURE_BAND):
        self._model = model
        self._threshold = threshold
        self.unsure = unsure

    @property
    def model(self) -> DetectorModel:
        """The model in use (the shipped one is loaded on first use)."""
        if self._model is None:
            self._model = load_detector_model()
        return self._model

    async def detect(self, message: str, history: Sequence[Turn]) -> Detection:
        """Decide whether ``message`` needs ``history`` (oldest first) to be understood."""
        return self.detect_texts(message, [t.content for t in history])

    def detect_texts(self, message: str, context: Sequence[str]) -> Detection:
        """Synchronous core of `detect` over plain turn texts (oldest first)."""
        intent = classify_follow_up_intent(message)
        context = [c for c in context if c and c.strip()]
        if not context:
            # Nothing earlier to lean on: even "举个例子" cannot be rewritten from history.
            return Detection(needs_context=False, score=0.0, intent=intent,
                             reason="no earlier turns", sure=True)
        score = self.model.probability(message, context)
        threshold = self.model.threshold if self._threshold is None else self._threshold
        if intent is not None and intent != "pronoun":
            # These intents operate on the last answer by definition.
            return Detection(needs_context=True, score=max(score, threshold), intent=intent,
                             reason=f"follow-up intent {intent}", sure=True)
        cue = strong_cue(message)
        needs = score >= threshold or cue is not None
        reason = f"model p={score:.2f}" + (f", cue: {cue}" if cue else "")
        sure = sure_of(score, cued=cue is not None, unsure=self.unsure)
        if cue is not None:
            score = max(score, threshold)
        return Detection(needs_context=needs, score=round(score, 4), intent=intent,
                         reason=reason, sure=sure)
