"""Offline incremental summariser: extractive and bounded.

Each call folds the newly covered turns into the previous summary. The new turns are cut
into sentences; each sentence is scored for what a summary must keep —
numbers, named entities, preferences and constraints, open questions and tasks, emotion
words (kept verbatim, marked with their 1–5 intensity) — plus jieba keywords (Chinese) or
repeated content words (English), who spoke and position. The best sentences up to
``block_chars`` form a new block, in conversation order, one line per speaker turn
(``用户: …`` / ``User: …``). When the whole summary passes ``max_chars``, the lowest
scoring lines of the older blocks go (the newest block stays), so the summary grows slowly
and keeps what matters. Finally the audit (`contextmode.processors.audit`) puts back any
number, entity or constraint the block dropped, on a ``要点:`` / ``Facts:`` line.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from ..text import Language, detect_language
from ..text import keywords as tfidf_keywords
from ..types import Summary, Turn, utc_now
from .audit import CLAUSE as _CLAUSE
from .audit import Fact, extract_facts, join_facts_line, restore_facts, split_facts_line
from .base import ModelFree, SummaryResult
from .constraints import content_words, extract_constraints
from .emotion import EmotionAnalysis, analyze_emotion

__all__ = ["OfflineSummarizer", "score_sentence"]

DEFAULT_BLOCK_CHARS = {"zh": 200, "en": 600}
"""Characters of new text per call: 100–200 Chinese characters per block, and
about the same number of tokens in English (≈ 4 characters a token)."""
DEFAULT_MAX_CHARS = {"zh": 1000, "en": 4000}
"""Characters of the whole summary, facts line included (≈ the summary layer's 1500-token budget)."""

_LABELS = {"zh": {"user": "用户", "assistant": "助手", "system": "系统"},
           "en": {"user": "User", "assistant": "Assistant", "system": "System"}}
_ZH_SENTENCE = re.compile(r"[^。！？!?\n；;]+[。！？!?；;]*[”」』）)]?")
_EN_SENTENCE = re.compile(r"[^.!?\n]+(?:[.!?]+[\"')\]]?|$)")
_PREFERENCE = re.compile(
    r"喜欢|讨厌|不要|别|想要|希望|需要|偏好|过敏|预算|不吃|不能|必须|一定要|"
    r"\b(?:prefer|like|love|hate|want|need|must|allergic|budget|never|always|favou?rite)\b",
    re.IGNORECASE,
)
_TASK = re.compile(
    r"帮我|请|能不能|可不可以|怎么|如何|计划|打算|准备|记得|提醒|待办|还没|下次|明天|下周|"
    r"\b(?:please|can you|could you|help me|how do|how to|plan|planning|going to|will|"
    r"need to|have to|remind|todo|to-do|tomorrow|next week|deadline)\b",
    re.IGNORECASE,
)
_FILLER = re.compile(
    r"^(?:你好|您好|嗯+|哦+|好的?|谢谢|哈哈+|是的|对|行|有什么(?:可以|能)?帮(?:你|您)的?(?:吗)?|ok|okay|hi|hello|hey|thanks?(?: you)?|"
    r"yes|yeah|yep|sure|cool|great|wow|lol|haha)[\s!！.。~,，?？]*$",
    re.IGNORECASE,
)


_USER_EMOTION_WEIGHT = 0.6
"""Weight of the user's emotion intensity in a sentence's score (the strongest one is kept anyway)."""


@dataclass(frozen=True, kw_only=True)
class _Sentence:
    order: int
    turn_index: int
    label: str
    text: str
    score: float
    emotion_level: int


def _sentences(text: str, language: Language) -> list[str]:
    pattern = _ZH_SENTENCE if language == "zh" else _EN_SENTENCE
    return [s.strip() for s in pattern.findall(text) if s.strip()]


def _keywords(text: str, language: Language, top: int = 10) -> set[str]:
    if language == "zh":
        return set(tfidf_keywords(text, top))
    counts = Counter(w for w in content_words(text) if len(w) > 3)
    return {w for w, n in counts.most_common(top) if n >= 2}


def score_sentence(
    sentence: str, language: Language, *, role: str = "user", keywords: set[str] | None = None
) -> tuple[float, int]:
    """How much a sentence is worth keeping, and its 1–5 emotion level (0 when calm).

    Unitless; what counts: numbers, entities, preferences and constraints,
    questions and tasks, emotion, keywords, the user's own words.
    """
    facts = extract_facts(sentence, language)
    score = _with_intent(_fact_score(facts), sentence)
    emotion = analyze_emotion(sentence)
    level = emotion.level if emotion.intensity >= 0.5 else 0
    # The user's feelings must survive; the other side's
    # politeness ("Wow, great!") is not.
    score += (_USER_EMOTION_WEIGHT if role == "user" else 0.4) * emotion.intensity
    if keywords:
        hits = sum(1 for k in keywords if k in sentence.lower())
        score += min(0.3 * hits, 1.5)
    if role == "user":
        score *= 1.2
    score -= _small_talk_penalty(sentence, language, facts, emotion)
    if role != "user":
        level = 0  # only the user's feelings are marked
    return score, level


def _fact_score(facts: Sequence[Fact]) -> float:
    """Numbers and entities of a sentence, up to three of each."""
    numbers = sum(1 for f in facts if f.kind == "number")
    entities = sum(1 for f in facts if f.kind == "entity")
    return 1.0 * min(numbers, 3) + 0.8 * min(entities, 3)


def _with_intent(score: float, sentence: str) -> float:
    """``score`` plus a constraint (or a mere preference), a question or a task."""
    if extract_constraints(sentence, generic_facts=False)[0]:
        score += 2.0
    elif _PREFERENCE.search(sentence):
        score += 1.0
    if _TASK.search(sentence) or sentence.rstrip().endswith(("?", "？")):
        score += 1.0
    return score


def _small_talk_penalty(
    sentence: str, language: Language, facts: Sequence[Fact], emotion: EmotionAnalysis
) -> float:
    """What a greeting, a filler or (English) praise with little content loses."""
    size = len(sentence) if language == "zh" else len(sentence.split())
    if _FILLER.match(sentence) or size < (6 if language == "zh" else 4):
        return 1.5
    if language == "en":
        # Praise and small talk ("Wow, Caroline, that's great!") say little beyond the
        # feeling: count the words that are neither emotion words nor names.
        emotional = {h.word for h in emotion.hits}
        names = {f.text.lower() for f in facts if f.kind == "entity"}
        informative = [w for w in content_words(sentence) if w not in emotional and w not in names]
        if len(informative) < 3:
            return 1.0
    return 0.0


def _mark_emotion(text: str, level: int, language: Language) -> str:
    if level < 4:
        return text
    return f"{text}（情绪强度{level}/5）" if language == "zh" else f"{text} (emotion {level}/5)"


def _clip(text: str, limit: int) -> str:
    """The leading whole clauses of ``text`` that fit in ``limit`` characters (at least the
    first clause, whole): a summary never shows a word cut in half."""
    if len(text) <= limit:
        return text
    clauses = _CLAUSE.findall(text) or [text]
    kept: str = clauses[0]
    for clause in clauses[1:]:
        if len(kept) + len(clause) > limit:
            break
        kept += clause
    return kept.strip()


def _label(turn: Turn, language: Language) -> str:
    speaker = turn.metadata.get("speaker") if turn.metadata else None
    return str(speaker) if speaker else _LABELS[language].get(turn.role, turn.role)


class OfflineSummarizer(ModelFree):
    """`Summarizer` that extracts the most informative sentences; no model, deterministic.

    ``block_chars``: characters of new text per call (default 200 Chinese / 600 English).
    ``max_chars``: characters of the whole summary (default 1000 Chinese / 4000 English).
    ``audit``: put back dropped numbers, entities and constraints on a facts line.
    """

    def __init__(
        self,
        *,
        block_chars: int | None = None,
        max_chars: int | None = None,
        audit: bool = True,
        max_restored: int = 12,
    ) -> None:
        self.block_chars = block_chars
        self.max_chars = max_chars
        self.audit = audit
        self.max_restored = max_restored

    async def summarize(self, previous: Summary | None, turns: Sequence[Turn]) -> SummaryResult:
        """Fold ``turns`` (not yet covered) into ``previous`` and return the new summary.

        Runs in a worker thread: jieba's tagging is CPU-bound and would otherwise
        hold the event loop (and every streaming reply on it) for up to ~100 ms.
        """
        return await asyncio.to_thread(self.summarize_text, previous.text if previous else None, turns)

    def summarize_text(self, previous: str | None, turns: Sequence[Turn]) -> SummaryResult:
        """Same as `summarize`, synchronous, from the previous summary's text."""
        turns = [t for t in turns if not t.notice]  # engine notices are never summarised
        text_all = " ".join(t.content for t in turns) + " " + (previous or "")
        language = detect_language(text_all)
        block_chars = self.block_chars or DEFAULT_BLOCK_CHARS[language]
        max_chars = self.max_chars or DEFAULT_MAX_CHARS[language]
        old_body, old_items = split_facts_line(previous or "")
        block = self._block(turns, language, block_chars)
        lines = [line for line in old_body.splitlines() if line.strip()]
        facts_budget = max_chars // 4
        body_budget = max_chars - min(facts_budget, sum(len(i) + 2 for i in old_items) + 20)
        kept = self._fit(lines, block, language, body_budget)
        text = join_facts_line("\n".join(kept), old_items, language)
        if not self.audit:
            return SummaryResult(text=text)
        # Lines squeezed out of the older blocks are audited too: their facts move to the
        # facts line instead of vanishing.
        dropped = [line for line in lines if line not in kept]
        sources = [*_as_turns(dropped), *turns]
        return restore_facts(
            text, sources, max_restored=self.max_restored, max_line_chars=facts_budget
        )

    def _block(self, turns: Sequence[Turn], language: Language, block_chars: int) -> list[str]:
        candidates = _candidates(turns, language)
        return _lines(_choose(candidates, block_chars), language)

    def _fit(
        self, old: list[str], block: list[str], language: Language, budget: int
    ) -> list[str]:
        """Old lines plus the new block; drop the weakest old lines while over ``budget``."""
        lines = old + block
        total = sum(len(line) + 1 for line in lines)
        if total <= budget or not old:
            return lines
        scored = []
        for index, line in enumerate(old):
            body = line.split(": ", 1)[-1]
            score, _ = score_sentence(body, language)
            # Older lines weigh a little less: a recent fact is likelier to matter next.
            scored.append((score - 0.5 * (len(old) - index) / len(old), index))
        keep = set(range(len(old)))
        for _, index in sorted(scored):
            if total <= budget:
                break
            keep.discard(index)
            total -= len(old[index]) + 1
        return [line for i, line in enumerate(old) if i in keep] + block


def _candidates(turns: Sequence[Turn], language: Language) -> list[_Sentence]:
    """Every sentence of the block's turns, scored (the first and the last turn a little up)."""
    joined = "\n".join(t.content for t in turns)
    keywords = _keywords(joined, language) if joined.strip() else set()
    candidates: list[_Sentence] = []
    for turn_index, turn in enumerate(turns):
        if turn.role == "system" or (turn.partial and not turn.content.strip()):
            continue
        for position, sentence in enumerate(_sentences(turn.content, language)):
            score, level = score_sentence(sentence, language, role=turn.role, keywords=keywords)
            if position == 0 and turn_index == 0:
                score += 0.3
            if turn_index == len(turns) - 1:
                score += 0.3
            candidates.append(
                _Sentence(order=len(candidates), turn_index=turn_index, label=_label(turn, language),
                          text=sentence, score=score, emotion_level=level)
            )
    return candidates


def _choose(candidates: list[_Sentence], block_chars: int) -> list[_Sentence]:
    """The best sentences that fit in ``block_chars``, in their original order."""
    chosen: list[_Sentence] = []
    used = 0
    ranked = sorted(candidates, key=lambda c: (-c.score, c.order))
    # The user's strongest feeling of the block is kept verbatim, whatever
    # else competes for the room.
    strongest = max(
        (c for c in candidates if c.emotion_level >= 4 and len(c.text) <= block_chars),
        key=lambda c: (c.emotion_level, c.score),
        default=None,
    )
    if strongest is not None:
        ranked.remove(strongest)
        ranked.insert(0, strongest)
    for cand in ranked:
        if cand.score <= 0 and chosen:
            break  # greetings and fillers never take room, however much is left
        size = len(cand.text)
        if used + size > block_chars:
            if chosen or size <= block_chars:
                continue
            cand = _Sentence(**{**cand.__dict__, "text": _clip(cand.text, block_chars)})
            size = len(cand.text)
        chosen.append(cand)
        used += size
    chosen.sort(key=lambda c: c.order)
    return chosen


def _lines(chosen: Sequence[_Sentence], language: Language) -> list[str]:
    """One line per turn: its speaker, then its chosen sentences (strong feelings marked)."""
    lines: list[str] = []
    last_turn = -1
    sep = "" if language == "zh" else " "
    for cand in chosen:
        piece = _mark_emotion(cand.text, cand.emotion_level, language)
        if cand.turn_index == last_turn:
            lines[-1] += sep + piece
        else:
            lines.append(f"{cand.label}: {piece}")
        last_turn = cand.turn_index
    return lines


def _as_turns(lines: Sequence[str]) -> list[Turn]:
    now = utc_now()
    return [
        Turn(seq=0, role="user", content=line.split(": ", 1)[-1], tokens=0, created_at=now)
        for line in lines
    ]
