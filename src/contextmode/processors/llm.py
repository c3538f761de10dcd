"""LLM-backed processors: one implementation of each protocol in `processors.base`.

Each takes a `ChatModel` and sends the matching prompt of `contextmode.prompts`.
Bad model output never fails a turn: it is cleaned or parsed tolerantly, and
when nothing usable is left the processor returns a safe default (or asks its
``fallback``, typically the offline processor) and logs a warning.

Model failures (`ModelError`: timeouts, 429, 5xx) are handled by where the
processor runs:

- `LLMContextDetector` and `LLMRewriter` sit on the response path, so they fall
  back (or keep the message as it is) and the turn goes on;
- `LLMSummarizer`, `LLMConstraintExtractor` and `LLMEmotionScorer` run as
  background jobs, so without a ``fallback`` they re-raise the `ModelError` and
  the job is retried later rather than committing a made-up result.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from ..errors import ModelError, ModelTimeout
from ..jsonparse import extract_json, validate_as
from ..models.base import ChatModel
from ..prompts import CONSTRAINTS, DETECT, EMOTION, REWRITE, SUMMARY, Prompt
from ..types import Constraint, ConstraintKind, Summary, Turn
from ._llm_text import clean_model_text, format_turns, parse_intensity, parse_yes_no
from .audit import join_facts_line, restore_facts, split_facts_line
from .base import (
    ConstraintExtractor,
    ConstraintUpdate,
    ContextDetector,
    Detection,
    EmotionScorer,
    Rewrite,
    Rewriter,
    Summarizer,
    SummaryResult,
)
from .intents import classify_follow_up_intent, is_chinese

__all__ = [
    "LLMConstraintExtractor",
    "LLMContextDetector",
    "LLMEmotionScorer",
    "LLMRewriter",
    "LLMSummarizer",
    "clean_model_text",
    "format_turns",
    "parse_intensity",
    "parse_yes_no",
]

logger = logging.getLogger("contextmode.processors.llm")

_KINDS: frozenset[str] = frozenset({"preference", "constraint", "identity", "fact"})


async def _ask(
    model: ChatModel, prompt: Prompt, *, chinese: bool, max_tokens: int | None,
    timeout: float | None = None, **fields: object,
) -> str:
    """One ``complete`` call; ``timeout`` (seconds) bounds it on top of the client's own."""
    try:
        async with asyncio.timeout(timeout):
            return await model.complete(prompt.render(chinese=chinese, **fields), max_tokens=max_tokens)
    except TimeoutError:
        raise ModelTimeout(f"{prompt.tag} took longer than {timeout} s") from None


class LLMContextDetector:
    """`ContextDetector` asking the model whether a message needs the history (``yes``/``no``)."""

    def __init__(
        self,
        model: ChatModel,
        *,
        fallback: ContextDetector | None = None,
        history_turns: int = 4,
        max_tokens: int | None = 16,
        timeout: float | None = 10.0,
        prompt: Prompt = DETECT,
    ) -> None:
        """``history_turns`` newest turns are shown; ``max_tokens`` caps the verdict; after
        ``timeout`` seconds the turn goes on without the model (it is on the response path)."""
        self.model, self.fallback, self.prompt = model, fallback, prompt
        self.history_turns, self.max_tokens, self.timeout = history_turns, max_tokens, timeout

    async def detect(self, message: str, history: Sequence[Turn]) -> Detection:
        if not history:
            return Detection(needs_context=False, score=0.0, reason="no history")
        chinese = is_chinese(message)
        try:
            answer = await _ask(
                self.model, self.prompt, chinese=chinese, max_tokens=self.max_tokens, timeout=self.timeout,
                message=message, history=format_turns(history[-self.history_turns :], chinese=chinese),
            )
            verdict = parse_yes_no(answer)
        except ModelError as exc:
            logger.warning("context detection failed (%s); using the fallback", exc)
            verdict, answer = None, ""
        if verdict is None:
            if self.fallback is not None:
                return await self.fallback.detect(message, history)
            logger.warning("context detection gave no verdict (%r); assuming standalone", answer[:80])
            return Detection(needs_context=False, score=0.0, reason="llm gave no verdict")
        intent = classify_follow_up_intent(message) if verdict else None
        return Detection(
            needs_context=verdict, score=0.9 if verdict else 0.1, intent=intent,
            reason=f"{self.prompt.tag}: {'yes' if verdict else 'no'}",
        )


class LLMRewriter:
    """`Rewriter` turning a follow-up into one standalone question (seed 002)."""

    def __init__(
        self,
        model: ChatModel,
        *,
        fallback: Rewriter | None = None,
        history_turns: int = 8,
        turn_chars: int = 600,
        max_tokens: int | None = 256,
        timeout: float | None = 15.0,
        prompt: Prompt = REWRITE,
    ) -> None:
        """The newest ``history_turns`` turns (each cut to ``turn_chars`` characters) plus the
        summary are the memory context the rewrite sees; after ``timeout`` seconds the
        message goes on unchanged (the rewrite is on the response path)."""
        self.model, self.fallback, self.prompt = model, fallback, prompt
        self.history_turns, self.turn_chars, self.max_tokens = history_turns, turn_chars, max_tokens
        self.timeout = timeout

    async def rewrite(self, message: str, history: Sequence[Turn], *, summary: str | None = None) -> Rewrite:
        original = message.strip()
        if not history and not summary:
            return Rewrite(text=message, changed=False, source="llm")
        chinese = is_chinese(message)
        try:
            answer = await _ask(
                self.model, self.prompt, chinese=chinese, max_tokens=self.max_tokens, timeout=self.timeout,
                message=original, summary=summary or ("（无）" if chinese else "(none)"),
                history=format_turns(history[-self.history_turns :], chinese=chinese, turn_chars=self.turn_chars),
            )
            text = self._pick(answer)
        except ModelError as exc:
            logger.warning("rewrite failed (%s); keeping the message", exc)
            text = ""
        if not text or len(text) > max(4 * len(original), len(original) + 300):
            if self.fallback is not None:
                return await self.fallback.rewrite(message, history, summary=summary)
            return Rewrite(text=message, changed=False, source="llm")
        return Rewrite(text=text, changed=text != original, source="llm")

    @staticmethod
    def _pick(answer: str) -> str:
        """The question out of the answer: the first non-empty line once labels are dropped."""
        cleaned = clean_model_text(answer)
        for line in cleaned.splitlines():
            line = clean_model_text(line.lstrip("-*> ").strip())
            if line:
                return line
        return ""


class LLMSummarizer:
    """`Summarizer` folding new turns into the previous summary (seed 003 §3.2).

    The facts of the *previous summary* (numbers, names, constraints, its facts
    line) that the model's new summary dropped are put back on the facts line with
    `processors.audit.restore_facts`, so folding can never lose them. Auditing the
    new turns is `AuditedSummarizer`'s job: wrap this class in it.
    """

    def __init__(
        self,
        model: ChatModel,
        *,
        fallback: Summarizer | None = None,
        target_length: int = 300,
        turn_chars: int = 2000,
        max_tokens: int | None = 1024,
        prompt: Prompt = SUMMARY,
    ) -> None:
        """``target_length``: characters (Chinese) or words (English) asked of the summary."""
        self.model, self.fallback, self.prompt = model, fallback, prompt
        self.target_length, self.turn_chars, self.max_tokens = target_length, turn_chars, max_tokens

    async def summarize(self, previous: Summary | None, turns: Sequence[Turn]) -> SummaryResult:
        previous_text = previous.text if previous else ""
        if not turns:
            return SummaryResult(text=previous_text)
        chinese = any(is_chinese(t.content) for t in turns) or is_chinese(previous_text)
        try:
            answer = await _ask(
                self.model, self.prompt, chinese=chinese, max_tokens=self.max_tokens,
                target_length=self.target_length, previous=previous_text or ("（无）" if chinese else "(none)"),
                turns=format_turns(turns, chinese=chinese, turn_chars=self.turn_chars, times=True),
            )
            text = clean_model_text(answer)
            if not text:
                raise ModelError("the model returned an empty summary")
        except ModelError as exc:
            if self.fallback is None:
                raise
            logger.warning("summary failed (%s); using the fallback", exc)
            return await self.fallback.summarize(previous, turns)
        if previous is None:
            return SummaryResult(text=text)
        # Items of the previous facts line stay unless the new summary says them already.
        old_body, old_items = split_facts_line(previous.text)
        new_body, new_items = split_facts_line(text)
        carried = [i for i in old_items if i not in new_items and i not in new_body]
        text = join_facts_line(new_body, [*new_items, *carried], "zh" if chinese else "en")
        # The previous body read as one "turn", so the shared audit checks its facts too.
        as_turn = Turn(seq=previous.covers_seq, role="user", content=old_body,
                       tokens=previous.tokens, created_at=previous.created_at)
        audited = restore_facts(text, [as_turn])
        return SummaryResult(text=audited.text, restored_facts=(*carried, *audited.restored_facts))


@dataclass(frozen=True, kw_only=True)
class _ConstraintItem:
    key: str
    value: str
    kind: str = "constraint"
    quote: str = ""


@dataclass(frozen=True, kw_only=True)
class _ConstraintPayload:
    upsert: list[_ConstraintItem] = field(default_factory=list)
    remove: list[str] = field(default_factory=list)


_UPSERT_ALIASES = ("upsert", "constraints", "add", "items", "info_retrieval", "update")
_REMOVE_ALIASES = ("remove", "remove_keys", "removed", "retract", "delete")


def _normalise_payload(data: Any) -> dict[str, Any]:
    """Accept the shapes models actually produce: a bare list, aliases, a ``{key: value}`` dict."""
    if isinstance(data, list):
        data = {"upsert": data}
    if not isinstance(data, dict):
        return {}
    upsert: Any = next((data[k] for k in _UPSERT_ALIASES if k in data), [])
    remove: Any = next((data[k] for k in _REMOVE_ALIASES if k in data), [])
    if isinstance(upsert, dict):
        upsert = [v | {"key": k} if isinstance(v, dict) else {"key": k, "value": v} for k, v in upsert.items()]
    return {"upsert": upsert, "remove": remove}


def _norm_key(key: str) -> str:
    return re.sub(r"\s+", "_", key.strip().lower())[:64]


class LLMConstraintExtractor:
    """`ConstraintExtractor` asking for one JSON object (seed 003 §2.3, §4.4), parsed tolerantly."""

    def __init__(
        self,
        model: ChatModel,
        *,
        fallback: ConstraintExtractor | None = None,
        max_tokens: int | None = 512,
        max_value_chars: int = 200,
        prompt: Prompt = CONSTRAINTS,
    ) -> None:
        self.model, self.fallback, self.prompt = model, fallback, prompt
        self.max_tokens, self.max_value_chars = max_tokens, max_value_chars

    async def extract(self, turn: Turn, current: Sequence[Constraint]) -> ConstraintUpdate:
        if turn.role != "user" or not turn.content.strip():
            return ConstraintUpdate()
        chinese = is_chinese(turn.content)
        remembered = "\n".join(f"- {c.key}: {c.value}" for c in current) or ("（无）" if chinese else "(none)")
        try:
            answer = await _ask(
                self.model, self.prompt, chinese=chinese, max_tokens=self.max_tokens,
                current=remembered, message=turn.content,
            )
        except ModelError as exc:
            if self.fallback is None:
                raise
            logger.warning("constraint extraction failed (%s); using the fallback", exc)
            return await self.fallback.extract(turn, current)
        data = extract_json(answer)
        payload = None
        if data is not None:
            try:
                payload = validate_as(_normalise_payload(data), _ConstraintPayload)
            except ValueError as exc:
                logger.warning("constraint JSON has the wrong shape: %s", exc)
        if payload is None:
            if self.fallback is not None:
                return await self.fallback.extract(turn, current)
            return ConstraintUpdate()
        return self._update(payload, turn)

    def _update(self, payload: _ConstraintPayload, turn: Turn) -> ConstraintUpdate:
        found: dict[str, Constraint] = {}
        for item in payload.upsert:
            key, value = _norm_key(item.key), " ".join(item.value.split())[: self.max_value_chars]
            if not key or not value:
                continue
            kind_text = item.kind.strip().lower()
            kind = cast(ConstraintKind, kind_text if kind_text in _KINDS else "constraint")
            quote = item.quote.strip()
            found[key] = Constraint(
                key=key, value=value, kind=kind, source_seq=turn.seq,
                quote=quote if quote and quote in turn.content else "",  # never keep invented quotes
            )
        removed = [k for k in dict.fromkeys(_norm_key(k) for k in payload.remove) if k and k not in found]
        return ConstraintUpdate(upsert=tuple(found.values()), remove_keys=tuple(removed))


class LLMEmotionScorer:
    """`EmotionScorer` asking for an intensity in 0–1 (seed 001), clamped."""

    def __init__(
        self,
        model: ChatModel,
        *,
        fallback: EmotionScorer | None = None,
        max_tokens: int | None = 64,
        text_chars: int = 2000,
        prompt: Prompt = EMOTION,
    ) -> None:
        self.model, self.fallback, self.prompt = model, fallback, prompt
        self.max_tokens, self.text_chars = max_tokens, text_chars

    async def score(self, text: str) -> float:
        if not text.strip():
            return 0.0
        try:
            answer = await _ask(
                self.model, self.prompt, chinese=is_chinese(text), max_tokens=self.max_tokens,
                text=text[: self.text_chars],
            )
        except ModelError as exc:
            if self.fallback is None:
                raise
            logger.warning("emotion scoring failed (%s); using the fallback", exc)
            return await self.fallback.score(text)
        value = parse_intensity(answer)
        if value is None:
            logger.warning("no emotion intensity in %r", answer[:80])
            return await self.fallback.score(text) if self.fallback is not None else 0.0
        return value
