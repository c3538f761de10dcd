"""Summary audit: find the facts a summary lost and put them back.

After each summary, `audit_summary` lists the numbers (with their units: 50元, 3点, $20,
2023), named entities (jieba.posseg ``nr/ns/nt/nz`` for Chinese; capitalised spans for
English) and stated constraints of the covered turns that the summary text no longer
contains. `restore_facts` appends them, each in the shortest clause of the conversation
that holds it, to one compact ``要点:`` / ``Facts:`` line, so compaction can never silently
forget a fact. `AuditedSummarizer(inner)` wraps any `Summarizer` (the LLM one too) with it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ..text import Language, analyze_text, detect_language
from ..types import Summary, Turn
from .base import ModelFree, Summarizer, SummaryResult, calls_no_model, fits_a_window

if TYPE_CHECKING:
    from ..tokens.base import TokenCounter
from .constraints import content_words, extract_constraints
from .lexicons import emotion_words

__all__ = [
    "CLAUSE",
    "FACTS_LABELS",
    "AuditedSummarizer",
    "Fact",
    "audit_summary",
    "collect_facts",
    "extract_facts",
    "fact_kept",
    "join_facts_line",
    "restore_facts",
    "split_facts_line",
]

FACTS_LABELS = {"zh": "要点: ", "en": "Facts: "}
"""Prefix of the line that holds restored facts, by language."""
_FACT_SEP = {"zh": "；", "en": "; "}

_CN_DIGITS = "零〇一二两三四五六七八九十百千万"
_ZH_UNITS = (
    "%|％|元|块钱|块|毛|万元|万|千|点半|点钟|点|岁|年|月|日|号|天|周|个月|小时|分钟|秒|公斤|斤|克|"
    "米|公里|千米|厘米|度|次|人|本|张|件|层|楼|页|集|台|辆|间|套|个"
)
_ZH_NUMBER = re.compile(
    r"(\d+(?:[.,:]\d+)*|[" + _CN_DIGITS + r"]{1,6})\s*(" + _ZH_UNITS + r")?"
)
_EN_NUMBER = re.compile(
    r"(?:[$¥€£]\s?\d[\d,]*(?:\.\d+)?(?:\s?(?:k|m|million|billion)\b)?"
    r"|\d{1,2}:\d{2}\s?(?:am|pm|a\.m\.|p\.m\.)?"
    r"|\d[\d,]*(?:\.\d+)?(?:\s?(?:%|percent|dollars|bucks|yuan|euros|kg|lbs|pounds|km|miles|"
    r"hours?|hrs|minutes?|mins|days?|weeks?|months?|years?|am|pm|st|nd|rd|th)\b)?)",
    re.IGNORECASE,
)
_EN_CAPS = re.compile(r"[A-Z][\w'’&-]*(?:[ \t]+(?:of|the|de|and|&)?[ \t]*[A-Z][\w'’&-]*)*")
_ZH_ENTITY_FLAGS = ("nr", "ns", "nt", "nz", "nrt", "nrfg")
_ZH_NOT_ENTITIES = frozenset(["谢谢", "你好", "您好", "哈哈", "嗯嗯", "好吧", "拜拜", "晚安", "早安"])
CLAUSE = re.compile(r"(?:[^，。！？；,;!?.\n]|\.(?=\S))+[，。！？；,;!?.]?")
"""One clause and its closing punctuation (a full stop inside "3.5" does not end it)."""
_CLAUSE = CLAUSE
_STARTERS_TEXT = """
hey hi hello thanks thank wow yes no oh well so congrats congratulations yeah sure good
great dear okay ok and but or the a an my your our his her their this that these those
it its we you he she they i aw aww awesome nice cool haha lol omg woohoo yay bye
"""
_EN_STARTERS = frozenset(_STARTERS_TEXT.split())


@dataclass(frozen=True, kw_only=True)
class Fact:
    """A fact a summary should keep."""

    text: str
    """As it appears in the conversation (``50元``, ``$20``, ``北京``, ``Melanie``)."""
    kind: Literal["number", "entity", "constraint"]
    weight: float = 1.0
    """Priority when only some can be restored (constraints > numbers > entities)."""
    quote: str = ""
    """The user's words a constraint was read from (restored instead of our label for it)."""


def _cn_to_int(text: str) -> int | None:
    values = {"零": 0, "〇": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5,
              "六": 6, "七": 7, "八": 8, "九": 9}
    units = {"十": 10, "百": 100, "千": 1000, "万": 10000}
    total, section, digit = 0, 0, None
    for ch in text:
        if ch in values:
            digit = values[ch]
        elif ch in units:
            unit = units[ch]
            if unit == 10000:
                total += (section + (digit or 0)) * unit
                section = 0
            else:
                section += (digit if digit is not None else 1) * unit
            digit = None
        else:
            return None
    return total + section + (digit or 0)


def _number_variants(core: str) -> list[str]:
    """Spellings that count as the same number: ``五十`` ↔ ``50``, ``1,000`` ↔ ``1000``."""
    variants = {core, core.replace(",", "")}
    if core and core[0] in _CN_DIGITS:
        value = _cn_to_int(core)
        if value is not None:
            variants.add(str(value))
    return [v for v in variants if v]


def _zh_facts(text: str) -> list[Fact]:
    facts: list[Fact] = []
    for match in _ZH_NUMBER.finditer(text):
        core, unit = match.group(1), match.group(2) or ""
        if core[0] in _CN_DIGITS and (not unit or core in ("一", "两")):
            continue  # 一个 / 两天 / 十分: too common to be a fact worth pinning
        if core[0] in _CN_DIGITS and unit in ("个", "次", "点", "天", "本", "张", "件", "人"):
            continue
        facts.append(Fact(text=core + unit, kind="number", weight=2.0 if unit else 1.5))
    for word, flag in analyze_text(text).pos:
        # jieba tags a lone 谢谢 as a person name: politeness and feelings are not entities.
        if word in _ZH_NOT_ENTITIES or word in emotion_words("zh"):
            continue
        if flag in _ZH_ENTITY_FLAGS and len(word) >= 2:
            facts.append(Fact(text=word, kind="entity", weight=1.0))
    return facts


def _en_facts(text: str) -> list[Fact]:
    facts: list[Fact] = []
    for match in _EN_NUMBER.finditer(text):
        value = match.group().strip()
        if not re.search(r"\d", value):
            continue
        facts.append(Fact(text=value, kind="number", weight=2.0 if not value.isdigit() else 1.5))
    sentence_starts = {m.end() for m in re.finditer(r"(?:^|[.!?]\s+|\n)[\"'(]*", text)}
    lowered = text.lower()
    for match in _EN_CAPS.finditer(text):
        span = match.group().strip(".'’-&")
        if not span or span in {"I", "I'm", "I've", "I'd", "I'll", "OK", "Ok"}:
            continue
        if span.startswith(("I'", "I’")):
            continue
        if match.start() in sentence_starts and " " in span:
            first, rest = span.split(None, 1)
            if first.lower() in _EN_STARTERS:
                span = rest  # "Hey Mel" is Mel
        if match.start() in sentence_starts and " " not in span:
            # A capital after a full stop is only a name if the word is capitalised
            # elsewhere too (Hey, Thanks and Wow are not).
            mid = span.lower() not in _EN_STARTERS and re.search(
                r"[a-z,;:]\s+" + re.escape(span) + r"\b", text
            )
            if not mid:
                continue
        if len(span) < 2 or lowered.count(span.lower()) == 0:
            continue
        facts.append(Fact(text=span, kind="entity", weight=1.0))
    return facts


def extract_facts(text: str, language: Language | None = None) -> list[Fact]:
    """Numbers with units and named entities of ``text``, deduplicated, in order."""
    lang = language or detect_language(text)
    raw = _zh_facts(text) if lang == "zh" else _en_facts(text)
    seen: set[str] = set()
    out: list[Fact] = []
    for fact in raw:
        key = fact.text.lower()
        if key not in seen:
            seen.add(key)
            out.append(fact)
    return out


def fact_kept(fact: Fact, summary_text: str) -> bool:
    """True when ``summary_text`` still says ``fact`` (number spellings and case aside)."""
    haystack = summary_text.lower().replace(",", "")
    if fact.kind == "number":
        core = re.sub(r"[^\d" + _CN_DIGITS + r".:]", "", fact.text) or fact.text
        # Whole numbers only: 3点 is not kept by 3000元.
        return any(
            re.search(r"(?<![\d" + _CN_DIGITS + r"])" + re.escape(v.lower()) + r"(?![\d" + _CN_DIGITS + r"])", haystack)
            for v in _number_variants(core)
        )
    if fact.kind == "constraint":
        if fact.text.lower() in haystack:
            return True
        words = set(content_words(fact.text))
        present = set(content_words(summary_text))
        # Labels like "名字:" or "lives in" are ours, not the user's: most words suffice.
        return bool(words) and len(words & present) / len(words) >= 0.6
    return fact.text.lower() in haystack


def collect_facts(turns: Sequence[Turn], language: Language) -> list[Fact]:
    """Constraints (user turns), numbers and entities of ``turns``, deduplicated, in order."""
    facts: list[Fact] = []
    seen: set[str] = set()
    for turn in turns:
        found = list(extract_facts(turn.content, language))
        if turn.role == "user":
            constraints, _ = extract_constraints(turn.content, generic_facts=False)
            found = [Fact(text=c.value, kind="constraint", weight=3.0, quote=c.quote)
                     for c in constraints] + found
        for fact in found:
            if fact.text.lower() not in seen:
                seen.add(fact.text.lower())
                facts.append(fact)
    return facts


def audit_summary(summary_text: str, covered_turns: Sequence[Turn]) -> list[str]:
    """The numbers, entities and constraints of ``covered_turns`` that ``summary_text`` lost."""
    language = detect_language(" ".join(t.content for t in covered_turns) or summary_text)
    return [
        f.text for f in collect_facts(covered_turns, language) if not fact_kept(f, summary_text)
    ]


def split_facts_line(summary_text: str) -> tuple[str, list[str]]:
    """Split a summary into its body and the items of its ``要点:`` / ``Facts:`` line."""
    body_lines: list[str] = []
    items: list[str] = []
    for line in summary_text.splitlines():
        for language, label in FACTS_LABELS.items():
            if line.startswith(label):
                items.extend(i.strip() for i in line[len(label) :].split(_FACT_SEP[language].strip()))
                break
        else:
            body_lines.append(line)
    return "\n".join(body_lines).strip(), [i for i in items if i]


_WORDLESS = re.compile(r"[\d\W_]+")


def join_facts_line(body: str, items: Sequence[str], language: Language) -> str:
    """``body`` followed by one facts line holding ``items`` (none when empty); an item with
    no word in it ("1.", "8.") is never listed."""
    items = [i for i in items if _WORDLESS.sub("", i)]
    if not items:
        return body
    line = FACTS_LABELS[language] + _FACT_SEP[language].join(items)
    return f"{body}\n{line}" if body else line


def _context_of(fact: Fact, turns: Sequence[Turn], language: Language) -> str:
    """The shortest whole clause holding the fact (up to 40 CJK characters / 25 words),
    else the fact alone."""
    if fact.kind == "constraint":
        return _quoted_clause(fact, language)
    needle = fact.text.lower()
    best: str | None = None
    for turn in turns:
        for clause in _CLAUSE.findall(turn.content):
            if needle in clause.lower() and (best is None or len(clause) < len(best)):
                best = clause
    if best is None:
        return fact.text
    best = best.strip(" ，。！？；,;!?\n")
    # The whole clause when it is short enough, else the fact alone: never a cut clause.
    if language == "zh":
        return best if len(best) <= 40 else fact.text
    return best if len(best.split()) <= 25 else fact.text


_LABEL_WORDS = frozenset(content_words("likes dislikes fan"))
"""Words of our labels for a preference, not the user's ("dislikes" for "I hate")."""


def _quoted_clause(fact: Fact, language: Language) -> str:
    """The clause of the user's words that states constraint ``fact`` ("I like being a mom"
    rather than our "likes being a mom"), else the constraint as we label it."""
    words = set(content_words(fact.text)) - _LABEL_WORDS or set(content_words(fact.text))
    best, overlap = "", 0
    for clause in CLAUSE.findall(fact.quote):
        shared = len(words & set(content_words(clause)))
        if shared > overlap:
            best, overlap = clause.strip(" ，。！？；,;!?\n"), shared
    short = len(best) <= 40 if language == "zh" else len(best.split()) <= 25
    return best if best and short and overlap >= 0.6 * max(1, len(words)) else fact.text


def restore_facts(
    summary_text: str,
    covered_turns: Sequence[Turn],
    *,
    max_restored: int = 12,
    max_items: int = 40,
    max_line_chars: int | None = None,
) -> SummaryResult:
    """Append what the audit finds missing to the summary's facts line.

    At most ``max_restored`` new items per call (constraints first, then numbers, then the
    most mentioned entities), and ``max_items`` items / ``max_line_chars`` characters on the
    line in all (the oldest go first).
    """
    all_text = " ".join(t.content for t in covered_turns)
    language = detect_language(all_text or summary_text)
    facts = [
        f for f in collect_facts(covered_turns, language) if not fact_kept(f, summary_text)
    ]
    lowered = all_text.lower()
    facts.sort(key=lambda f: (-f.weight, -lowered.count(f.text.lower())))
    body, items = split_facts_line(summary_text)
    restored: list[str] = []
    for fact in facts:
        if len(restored) >= max_restored:
            break
        if any(fact_kept(fact, item) for item in items + restored):
            continue
        restored.append(_context_of(fact, covered_turns, language))
    if not restored:
        return SummaryResult(text=summary_text, restored_facts=())
    items = (items + restored)[-max_items:]
    while max_line_chars is not None and len(items) > 1 and sum(len(i) + 2 for i in items) > max_line_chars:
        items.pop(0)  # the oldest restored facts go first
    text = join_facts_line(body, items, language)
    return SummaryResult(text=text, restored_facts=tuple(restored))


class AuditedSummarizer(ModelFree):
    """Wraps any `Summarizer` so facts it dropped are put back on a facts line."""

    def __init__(self, inner: Summarizer, *, max_restored: int = 12, max_items: int = 40) -> None:
        self.inner = inner
        self.max_restored = max_restored
        self.max_items = max_items

    @property
    def model_free(self) -> bool:
        """The audit calls no model; the inner summariser may (`ModelFree`)."""
        return calls_no_model(self.inner)

    def call_tokens(self, previous: Summary | None, turns: Sequence[Turn], counter: TokenCounter) -> int | None:
        """The inner summariser's cost of one call in a model's window (`WindowedSummarizer`);
        ``None`` when it has no window to fit (the offline one)."""
        return self.inner.call_tokens(previous, turns, counter) if fits_a_window(self.inner) else None

    async def summarize(self, previous: Summary | None, turns: Sequence[Turn]) -> SummaryResult:
        """The inner summary of ``turns`` folded into ``previous``, then audited."""
        result = await self.inner.summarize(previous, turns)
        audited = restore_facts(
            result.text, turns, max_restored=self.max_restored, max_items=self.max_items
        )
        return SummaryResult(
            text=audited.text,
            restored_facts=(*result.restored_facts, *audited.restored_facts),
        )
