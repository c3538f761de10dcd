"""Follow-up intents over the last answer, in Chinese and English.

A follow-up such as "举个例子" or "simpler please" is answered from the previous
answer with an intent-specific template. Keyword lists and their priority
(simplify > detail > example > summary > pronoun) are the original design's; the English
lists are their equivalents.
"""

from __future__ import annotations

import re

from ..errors import NoPreviousAnswer
from ..text.lang import is_chinese
from .base import IntentKind

__all__ = [
    "INTENT_KEYWORDS",
    "INTENT_PRIORITY",
    "build_follow_up_prompt",
    "classify_follow_up_intent",
]

INTENT_PRIORITY: tuple[IntentKind, ...] = ("simplify", "detail", "example", "summary", "pronoun")
"""Order in which intents are tried; the first match wins."""

INTENT_KEYWORDS: dict[IntentKind, dict[str, tuple[str, ...]]] = {
    "detail": {
        "zh": ("详细", "更多信息", "再讲一遍", "补充", "继续", "扩展", "深入", "再说一遍", "重复一下"),
        "en": ("more detail", "in detail", "elaborate", "tell me more", "go on", "continue",
               "expand on", "go deeper", "say that again", "repeat that"),
    },
    "simplify": {
        "zh": ("通俗一点", "简单一点", "简略一点", "别太专业", "小白解释", "用比喻", "用例子", "别用术语"),
        "en": ("simpler", "simplify", "in plain", "plain english", "layman", "less technical",
               "like i'm five", "eli5", "use an analogy", "without jargon"),
    },
    "example": {
        "zh": ("举个例子", "具体点", "案例", "实例"),
        "en": ("for example", "an example", "example?", "give me an example", "be more specific",
               "a concrete", "case study", "for instance"),
    },
    "summary": {
        "zh": ("总结", "概括", "归纳"),
        "en": ("summarize", "summarise", "sum up", "summary", "tl;dr", "tldr", "in short",
               "recap"),
    },
    "pronoun": {
        "zh": ("它", "它们", "那些", "这个", "那个", "这些", "这点", "那点"),
        "en": ("it", "they", "them", "those", "these", "that", "this one", "that one"),
    },
}
"""Intent → language → keywords. Chinese keywords match as substrings;
English ones match on word boundaries, so "it" does not fire inside "items"."""

_TEMPLATES: dict[str, dict[IntentKind, str]] = {
    "zh": {
        "detail": "基于以下内容，请进一步详细说明:\n{context}\n问题: {question}",
        "simplify": "请用更简单易懂的语言解释以下内容:\n{context}\n问题: {question}",
        "example": "请基于以下内容举一个具体例子:\n{context}\n问题: {question}",
        "summary": "请对以下内容进行简要总结:\n{context}\n问题: {question}",
        "pronoun": "基于以下内容，请解释‘{question}’所指的具体内容:\n{context}\n问题: {question}",
    },
    "en": {
        "detail": "Based on the following, please explain in more detail:\n{context}\nQuestion: {question}",
        "simplify": "Please explain the following in simpler, plain language:\n{context}\nQuestion: {question}",
        "example": "Please give one concrete example based on the following:\n{context}\nQuestion: {question}",
        "summary": "Please summarise the following briefly:\n{context}\nQuestion: {question}",
        "pronoun": "Based on the following, explain what '{question}' refers to:\n{context}\nQuestion: {question}",
    },
}

_EN_PATTERNS: dict[IntentKind, re.Pattern[str]] = {
    intent: re.compile(
        r"(?<![a-z])(?:" + "|".join(re.escape(k) for k in langs["en"]) + r")(?![a-z])"
    )
    for intent, langs in INTENT_KEYWORDS.items()
}


_REQUEST_MARKERS = ("请", "帮我", "给我", "麻烦", "能不能", "能否", "可以", "可不可以", "你", "再", "吗",
                    "？", "?", "please", "can you", "could you", "would you", "will you", "give me",
                    "tell me", "show me", "let's", "let me")
"""Words that address the assistant: a message holding one asks it for something."""
_NARRATION = re.compile(
    r"(我|我们|他|她|他们|今天|昨天|明天|上周|下周|刚才|早上|晚上)|\b(i|we|my|our|he|she|they|his|her|"
    r"their|today|yesterday|tomorrow|last)\b", re.I)
_REPORTED = re.compile(
    r"\b(?:asked|asks|told|tells|wants?|wanted|needs?|needed|made|makes|expects?|expected)\s+"
    r"(?:me|us|him|her|them)\s+to\b|(?<=[\u4e00-\u9fff])(?:让|叫|要求)(?:我|我们|他|她|他们)", re.I)
_CLAUSE = re.compile(r"[，,；;。.!！]|然后|and then")


def _only_mentions(query: str, lowered: str, keyword_at: int) -> bool:
    """True for a statement that merely mentions summarising, detail or examples: reported
    speech ("my boss asked me to summarize the notes", "老板让我总结"), or a later clause of a
    narration that does not address the assistant ("今天我们去公园玩，然后总结一下经验")."""
    if _REPORTED.search(query[:keyword_at + 1]) or _REPORTED.search(query):
        return True
    if any(m in lowered for m in _REQUEST_MARKERS):
        return False
    before = [m.start() for m in _CLAUSE.finditer(lowered, 0, keyword_at)]
    return bool(before) and bool(_NARRATION.search(query[:before[-1] + 1]))


def _keyword_at(intent: IntentKind, lowered: str) -> int:
    """Where ``intent``'s keyword starts in ``lowered`` (-1: none)."""
    spots = [lowered.find(k) for k in INTENT_KEYWORDS[intent]["zh"] if k in lowered]
    match = _EN_PATTERNS[intent].search(lowered)
    if match is not None:
        spots.append(match.start())
    return min(spots) if spots else -1


def classify_follow_up_intent(query: str) -> IntentKind | None:
    """The keyword follow-up intent of ``query``, or ``None`` when none matches or the message
    only mentions it (a statement about summarising, not a request to; `_only_mentions`)."""
    lowered = query.lower()
    for intent in INTENT_PRIORITY:
        at = _keyword_at(intent, lowered)
        if at < 0:
            continue
        if intent != "pronoun" and _only_mentions(query, lowered, at):
            return None
        return intent
    return None


def build_follow_up_prompt(
    intent: IntentKind, last_answer: str | None, question: str, *, locale: str | None = None
) -> str:
    """The intent's template over the previous answer.

    Raises `NoPreviousAnswer` ("当前没有可用的上文信息") when there is no answer to build on.
    """
    context = (last_answer or "").strip()
    if not context:
        raise NoPreviousAnswer(intent)
    lang = locale or ("zh" if is_chinese(question) else "en")
    return _TEMPLATES["zh" if lang.startswith("zh") else "en"][intent].format(
        context=context, question=question.strip()
    )
