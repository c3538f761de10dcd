"""LLM-backed processors: one implementation of each protocol in `processors.base`.

Each takes a `ChatModel` and sends the matching prompt of `contextmode.prompts`.
Bad model output never fails a turn: it is cleaned or parsed tolerantly, and
when nothing usable is left the processor returns a safe default (or asks its
``fallback``, typically the offline processor) and logs a warning.

Every call is bounded (``max_tokens`` per processor, a ``timeout`` per call;
`LLMLimits` reads both from the environment). Processors that expect JSON ask
for it on the wire with a schema (`StructuredChatModel.complete_json`) and still
parse tolerantly (`jsonparse.extract_json`, then pydantic). Output that fails
the schema, or whose values the user never said (the prompt's own examples,
empty or markup quotes), or that repeats the prompt, raises `OutputRejected`:
nothing from it is stored, and the job is counted ``rejected`` with the reason.

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
import math
import os
import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, NoReturn

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..errors import ContextWindowExceeded, ModelError, ModelTimeout, OutputRejected
from ..jsonparse import extract_json
from ..models.base import ChatModel, JsonSchema, answers_to_schema
from ..models.calls import PROMPT_ESTIMATE, call_log, model_step
from ..models.priority import call_priority, response_time_left, waits_excluded
from ..prompts import CONSTRAINTS, DETECT, EMOTION, REWRITE, SUMMARY, Prompt
from ..settings import env_int
from ..text.degenerate import ReplyGuard, is_looping, scripts_of
from ..text.lang import is_chinese
from ..tokens.base import TokenCounter
from ..tokens.tools import count_messages
from ..types import ChatMessage, Constraint, Summary, Turn
from ._llm_text import clean_model_text, format_turns, parse_intensity, parse_yes_no
from .audit import _cn_to_int, join_facts_line, restore_facts, split_facts_line
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
from .intents import classify_follow_up_intent
from .window import Cut, ModelWindow, fit_fields

__all__ = [
    "CONSTRAINTS_SCHEMA",
    "EMOTION_SCHEMA",
    "Degeneration",
    "LLMConstraintExtractor",
    "LLMContextDetector",
    "LLMEmotionScorer",
    "LLMLimits",
    "LLMRewriter",
    "LLMSummarizer",
    "check_grounded",
    "clean_model_text",
    "echoes_prompt",
    "format_turns",
    "parse_intensity",
    "parse_yes_no",
    "rewrite_budget",
    "verdict_given",
]

logger = logging.getLogger("contextmode.processors.llm")

_KINDS: frozenset[str] = frozenset({"preference", "constraint", "identity", "fact"})


@dataclass(frozen=True, kw_only=True)
class LLMLimits:
    """``max_tokens`` of each processor's call, from ``CONTEXTMODE_LLM_<NAME>_MAX_TOKENS``
    (``DETECT``, ``REWRITE``, ``SUMMARY``, ``CONSTRAINTS``, ``EMOTION``); small models
    loop, so every call has a cap. The reply's cap is ``CONTEXTMODE_LLM_REPLY_MAX_TOKENS``."""

    detect: int = 16
    rewrite: int = 128
    summary: int = 512
    constraints: int = 256
    emotion: int = 32

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LLMLimits:
        env = os.environ if env is None else env
        base = cls()
        return cls(**{
            name: env_int(env, f"CONTEXTMODE_LLM_{name.upper()}_MAX_TOKENS", getattr(base, name), minimum=1)
            for name in ("detect", "rewrite", "summary", "constraints", "emotion")
        })


CONSTRAINTS_SCHEMA = JsonSchema(name="constraints", schema={
    "type": "object",
    "properties": {
        "upsert": {
            "type": "array",
            "maxItems": 8,
            "items": {
                "type": "object",
                "properties": {
                    "key": {"type": "string"},
                    "value": {"type": "string"},
                    "kind": {"type": "string", "enum": ["preference", "constraint", "identity", "fact"]},
                    "quote": {"type": "string"},
                },
                "required": ["key", "value", "kind", "quote"],
            },
        },
        "remove": {"type": "array", "maxItems": 8, "items": {"type": "string"}},
    },
    "required": ["upsert", "remove"],
})
"""What the constraint extractor asks for on the wire."""

EMOTION_SCHEMA = JsonSchema(name="emotion", schema={
    "type": "object",
    "properties": {"intensity": {"type": "number", "minimum": 0, "maximum": 1}, "emotion": {"type": "string"}},
    "required": ["intensity"],
})
"""What the emotion scorer asks for on the wire."""


async def _ask(
    model: ChatModel, prompt: Prompt, *, chinese: bool, max_tokens: int | None,
    timeout: float | None = None, read: JsonSchema | Callable[[str], bool] | None = None,
    fit: tuple[ModelWindow | None, Sequence[Cut]] = (None, ()), **fields: str | int,
) -> str:
    """One call; ``timeout`` (seconds) bounds it on top of the client's own. ``fit``: the
    model's window, when known, and the fields that may be cut so the call fits it
    (`window.fit_fields`). ``read`` says how the answer is read: a `JsonSchema`, with
    ``complete_json`` when the model takes one; a test of the answer so far, streamed
    and the stream closed (the server stops generating) as soon as it holds (a verdict given, a
    line complete); else whole. A background call's wait for a slot does not count in
    ``timeout``; a reply's does. A reply call also ends with what is left of the turn's
    `response_budget` (the response path is bounded as a whole), and is not made once it is
    spent (`ModelTimeout` either way: the processor's offline fallback decides)."""
    left = response_time_left()
    if left is not None and (timeout is None or left < timeout):
        if left <= 0:
            _not_asked(prompt, "the response path's budget was spent")
        timeout, why = left, f"the response path's budget ({left:.1f} s left)"
    else:
        why = f"{timeout} s"
    window, cuts = fit
    if window is not None:
        fields = _fit(window, prompt, fields, chinese=chinese, max_tokens=max_tokens, cuts=cuts, timeout=timeout)
    messages = prompt.render(chinese=chinese, **fields)
    try:
        with model_step(prompt.name):
            # A background call's wait for a free slot is a deferral, not time the call took:
            # ``timeout`` is paused while it waits (`waits_excluded`), so only the model's own
            # ``background_wait_s`` ends that wait (`ModelDeferred`, tried again later).
            async with asyncio.timeout(timeout) as limit:
                with waits_excluded(limit):
                    if isinstance(read, JsonSchema):
                        if answers_to_schema(model):
                            return await model.complete_json(messages, schema=read, max_tokens=max_tokens)
                    elif read is not None:
                        return await _read_until(model.stream(messages, max_tokens=max_tokens), read)
                    return await model.complete(messages, max_tokens=max_tokens)
    except TimeoutError:
        raise ModelTimeout(f"{prompt.tag} took longer than {why}") from None


PROMPT_SHARE = 0.5
"""Of a response-path call's time, the most its prompt may take the server to read (the rest is
for its answer): at the server's measured rate (`CallLog.prompt_rate`), a longer prompt has its
history cut, newest lines kept. A cut call's prompt is read to its end all the same (a server
notices a closed request only when it generates), and the reply would wait for it."""


def _fit(
    window: ModelWindow, prompt: Prompt, fields: Mapping[str, str | int], *, chinese: bool,
    max_tokens: int | None, cuts: Sequence[Cut], timeout: float | None,
) -> dict[str, str | int]:
    """``fields`` cut to fit the model's ``window`` (`fit_fields`) and, for a reply call with a
    ``timeout``, what the server reads in `PROMPT_SHARE` of it; `ModelTimeout` (not asked) when
    even the cut prompt takes longer, for a reply call (`ContextWindowExceeded` otherwise)."""
    fitted = fit_fields(window, prompt, fields, chinese=chinese, max_tokens=max_tokens, cuts=cuts)
    rate = call_log().prompt_rate() if timeout is not None and call_priority() == "reply" else None
    if rate is None or timeout is None:
        return fitted
    readable = ModelWindow(tokens=int(PROMPT_SHARE * timeout * rate) + (max_tokens or 0), counter=PROMPT_ESTIMATE)
    try:
        return fit_fields(readable, prompt, fitted, chinese=chinese, max_tokens=max_tokens, cuts=cuts)
    except ContextWindowExceeded:
        _not_asked(prompt, f"its shortest prompt takes the server longer to read than {PROMPT_SHARE * timeout:.1f} s "
                           f"(~{rate:.0f} tokens/s)")


def _not_asked(prompt: Prompt, why: str) -> NoReturn:
    """Log a reply call that was not made, and raise `ModelTimeout` saying why."""
    call_log().note(prompt.name, "", f"not asked: {why}", priority="reply")
    raise ModelTimeout(f"{prompt.tag} not asked: {why}")


async def _read_until(deltas: AsyncIterator[str], enough: Callable[[str], bool]) -> str:
    """The streamed answer up to the delta after which ``enough`` holds (the stream is then
    closed), or the whole answer."""
    answer = ""
    try:
        async for delta in deltas:
            answer += delta
            if enough(answer):
                break
    finally:
        if isinstance(deltas, AsyncGenerator):
            await deltas.aclose()  # the model's stream ends here, so the server stops at once
    return answer


class Degeneration:
    """Watches a background answer as it streams with the reply's own guard
    (`text.degenerate.ReplyGuard`: a loop, a phrase said over and over, a drift into a script
    the call does not use); as `_ask`'s ``read``, it ends the stream once it degenerates, so
    a looping summary does not hold the model up to its token cap. `check` then rejects the
    answer: nothing of a degenerate answer is stored."""

    def __init__(self, messages: Sequence[ChatMessage]) -> None:
        self.guard = ReplyGuard(scripts_of(m.content for m in messages))

    def __call__(self, answer: str) -> bool:
        return self.guard.feed(answer[len(self.guard.text) :]) is not None

    def check(self, answer: str) -> None:
        """Raise `OutputRejected` when ``answer`` (all of it) has degenerated."""
        if answer.startswith(self.guard.text):
            self.guard.feed(answer[len(self.guard.text) :])
        else:  # not streamed through the guard (a JSON answer): judge it whole
            self.guard = ReplyGuard(frozenset(self.guard.used))
            self.guard.feed(answer)
        if (why := self.guard.why()) is not None:
            raise OutputRejected(f"the output degenerated: {why}")


def _settled(text: str) -> str:
    """``text`` up to its last blank or punctuation: the words the model has finished."""
    for i in range(len(text) - 1, -1, -1):
        if not (text[i].isalnum() or text[i] == "_"):
            return text[: i + 1]
    return ""


def verdict_given(answer: str) -> bool:
    """True once the finished words of ``answer`` hold a yes/no verdict (`parse_yes_no`)."""
    settled = _settled(answer)
    return bool(settled.strip()) and parse_yes_no(settled) is not None


_TAG = re.compile(r"</?[A-Za-z_\u4e00-\u9fff][^<>\n]{0,40}>")
_ECHO_CHARS = 24


def echoes_prompt(answer: str, messages: Sequence[ChatMessage], data: Sequence[str] = ()) -> str | None:
    """Why ``answer`` repeats the prompt rather than the conversation, or ``None``.

    It does when it holds the prompt's markup (``<new_turns>``, ``<b>``) or a
    24-character run of the prompt's own wording that is not in ``data`` (the
    user's text substituted into it), or when it loops.
    """
    if _TAG.search(answer):
        return "markup in the output"
    if is_looping(answer):
        return "the output repeats itself"
    flat = " ".join(answer.split())
    instructions = " ".join(m.content for m in messages if m.role == "system")
    for piece in data:
        if piece.strip():
            instructions = instructions.replace(" ".join(piece.split()), " ")
    instructions = " ".join(instructions.split())
    for i in range(0, max(0, len(instructions) - _ECHO_CHARS), 4):
        window = instructions[i : i + _ECHO_CHARS]
        if not window.isspace() and window in flat:
            return f"the output repeats the prompt ({window!r})"
    return None


class LLMContextDetector:
    """`ContextDetector` asking the model whether a message needs the history (``yes``/``no``)."""

    def __init__(
        self,
        model: ChatModel,
        *,
        fallback: ContextDetector | None = None,
        history_turns: int = 4,
        max_tokens: int | None = LLMLimits.detect,
        timeout: float | None = 10.0,
        prompt: Prompt = DETECT,
        window: ModelWindow | None = None,
    ) -> None:
        """``history_turns`` newest turns are shown; ``max_tokens`` caps the verdict; after
        ``timeout`` seconds the turn goes on without the model (it is on the response path).
        With the model's ``window``, a call that would not fit has its history cut (the newest
        lines kept), then the message (its end kept)."""
        self.model, self.fallback, self.prompt = model, fallback, prompt
        self.history_turns, self.max_tokens, self.timeout = history_turns, max_tokens, timeout
        self.window = window

    async def detect(self, message: str, history: Sequence[Turn]) -> Detection:
        """The ``fallback``'s verdict when it is `Detection.sure` (no model call: a cascade),
        else the model's; the ``reason`` says which decided."""
        if not history:
            return Detection(needs_context=False, score=0.0, reason="no history")
        first = None if self.fallback is None else await self.fallback.detect(message, history)
        if first is not None and first.sure:
            return replace(first, reason=f"offline, sure: {first.reason}")
        chinese = is_chinese(message)
        try:
            answer = await _ask(
                self.model, self.prompt, chinese=chinese, max_tokens=self.max_tokens, timeout=self.timeout,
                fit=(self.window, (("history", "tail"), ("message", "tail"))), read=verdict_given,
                message=message, history=format_turns(history[-self.history_turns :], chinese=chinese),
            )
            verdict = parse_yes_no(answer)
        except ModelError as exc:
            logger.warning("context detection failed (%s); using the fallback", exc)
            verdict, answer = None, ""
        if verdict is None:
            if first is not None:
                return replace(first, reason=f"offline, the model gave no verdict: {first.reason}")
            logger.warning("context detection gave no verdict (%r); assuming standalone", answer[:80])
            return Detection(needs_context=False, score=0.0, reason="llm gave no verdict")
        intent = classify_follow_up_intent(message) if verdict else None
        unsure = "" if first is None else f" (offline unsure: {first.reason})"
        return Detection(
            needs_context=verdict, score=0.9 if verdict else 0.1, intent=intent,
            reason=f"{self.prompt.tag}: {'yes' if verdict else 'no'}{unsure}",
        )


REWRITE_GROWTH = 2
"""A standalone question is at most this many times its message…"""
REWRITE_ANTECEDENT_CHARS = {"zh": 40, "en": 120}
"""…plus this many characters of what it names from earlier turns. Reference rewrites on the dev
data fit: 99 % of CANARD's (English), all of Restoration-200K's and REWRITE's (Chinese)."""
_BUDGET_MARGIN = 16
"""Tokens on top for a label or quotes the model puts around the question."""


def rewrite_budget(message: str, *, chinese: bool, counter: TokenCounter | None = None) -> int:
    """Tokens the longest standalone question of ``message`` takes (``REWRITE_GROWTH`` × the
    message plus the antecedent), at the message's own tokens per character when ``counter``
    counts them, else at one token per UTF-8 byte (no byte-level tokenizer makes more)."""
    text = message.strip() or " "
    chars = REWRITE_GROWTH * len(text) + REWRITE_ANTECEDENT_CHARS["zh" if chinese else "en"]
    tokens = counter.count(text) if counter is not None else len(text.encode())
    return _BUDGET_MARGIN + math.ceil(chars * max(tokens, 1) / len(text))


class LLMRewriter:
    """`Rewriter` turning a follow-up into one standalone question."""

    def __init__(
        self,
        model: ChatModel,
        *,
        fallback: Rewriter | None = None,
        history_turns: int = 8,
        turn_chars: int = 600,
        max_tokens: int | None = LLMLimits.rewrite,
        timeout: float | None = 15.0,
        prompt: Prompt = REWRITE,
        window: ModelWindow | None = None,
    ) -> None:
        """The newest ``history_turns`` turns (each cut to ``turn_chars`` characters) plus the
        summary are the memory context the rewrite sees; after ``timeout`` seconds the
        message goes on unchanged (the rewrite is on the response path). With the model's
        ``window``, a call that would not fit has its summary cut, then its history (the newest
        lines kept); the message is never cut (a message that alone does not fit stays as it is)."""
        self.model, self.fallback, self.prompt = model, fallback, prompt
        self.history_turns, self.turn_chars, self.max_tokens = history_turns, turn_chars, max_tokens
        self.timeout, self.window = timeout, window

    async def rewrite(self, message: str, history: Sequence[Turn], *, summary: str | None = None) -> Rewrite:
        original = message.strip()
        if not history and not summary:
            return Rewrite(text=message, changed=False, source="llm")
        chinese = is_chinese(message)
        try:
            answer = await _ask(
                self.model, self.prompt, chinese=chinese, max_tokens=self._budget(original, chinese),
                timeout=self.timeout, fit=(self.window, (("summary", "head"), ("history", "tail"))),
                read=self._line_given, message=original, summary=summary or ("（无）" if chinese else "(none)"),
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

    def _budget(self, original: str, chinese: bool) -> int | None:
        """``max_tokens`` of the call: what the longest standalone question of ``original`` can
        take (`rewrite_budget`), never above the configured ``max_tokens``."""
        counter = None if self.window is None else self.window.counter
        budget = rewrite_budget(original, chinese=chinese, counter=counter)
        return budget if self.max_tokens is None else min(self.max_tokens, budget)

    @classmethod
    def _line_given(cls, answer: str) -> bool:
        """True once a complete line of ``answer`` holds the question (`_pick`): the rest of
        the answer (an explanation, a second question) would be dropped anyway."""
        end = answer.rfind("\n")
        return end >= 0 and bool(cls._pick(answer[:end]))

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
    """`Summarizer` folding new turns into the previous summary.

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
        max_tokens: int | None = LLMLimits.summary,
        timeout: float | None = 60.0,
        prompt: Prompt = SUMMARY,
    ) -> None:
        """``target_length``: characters (Chinese) or words (English) asked of the summary."""
        self.model, self.fallback, self.prompt = model, fallback, prompt
        self.target_length, self.turn_chars, self.max_tokens = target_length, turn_chars, max_tokens
        self.timeout = timeout

    def _fields(self, previous: Summary | None, turns: Sequence[Turn]) -> tuple[bool, dict[str, str | int]]:
        """Whether the call is in Chinese, and the prompt's fields for it."""
        previous_text = previous.text if previous else ""
        chinese = any(is_chinese(t.content) for t in turns) or is_chinese(previous_text)
        return chinese, {
            "target_length": self.target_length,
            "previous": previous_text or ("（无）" if chinese else "(none)"),
            "turns": format_turns(turns, chinese=chinese, turn_chars=self.turn_chars, times=True),
        }

    def call_tokens(self, previous: Summary | None, turns: Sequence[Turn], counter: TokenCounter) -> int:
        """Tokens of the model's window one call of ``turns`` takes: its request (as ``counter``
        counts it) plus its ``max_tokens`` (``target_length`` × 2 when uncapped)."""
        chinese, fields = self._fields(previous, turns)
        messages = self.prompt.render(chinese=chinese, **fields)
        return count_messages(counter, messages) + (self.max_tokens or 2 * self.target_length)

    async def summarize(self, previous: Summary | None, turns: Sequence[Turn]) -> SummaryResult:
        previous_text = previous.text if previous else ""
        if not turns:
            return SummaryResult(text=previous_text)
        chinese, fields = self._fields(previous, turns)
        try:
            messages = self.prompt.render(chinese=chinese, **fields)
            degeneration = Degeneration(messages)
            answer = await _ask(
                self.model, self.prompt, chinese=chinese, max_tokens=self.max_tokens, timeout=self.timeout,
                read=degeneration, target_length=fields["target_length"], previous=fields["previous"],
                turns=fields["turns"],
            )
            degeneration.check(answer)
            text = clean_model_text(answer)
            if not text:
                raise OutputRejected("an empty summary")
            if (why := echoes_prompt(text, messages, [previous_text, *(t.content for t in turns)])) is not None:
                raise OutputRejected(why)
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


class _ConstraintItem(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, coerce_numbers_to_str=True)

    key: str = Field(min_length=1)
    value: str = Field(min_length=1)
    kind: Literal["preference", "constraint", "identity", "fact"] = "constraint"
    quote: str = ""

    @field_validator("kind", mode="before")
    @classmethod
    def _lower(cls, kind: object) -> object:
        return kind.strip().lower() if isinstance(kind, str) else kind


class _ConstraintPayload(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    upsert: list[_ConstraintItem] = Field(default_factory=list)
    remove: list[str] = Field(default_factory=list)


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


_WORD = re.compile(r"[a-z]{3,}")
_DIGITS = re.compile(r"\d+(?:[.,]\d+)*")
_CN_NUMBER = re.compile(r"[零〇一二两三四五六七八九十百千万]+")
_CJK = re.compile(r"[\u4e00-\u9fff]")
_STOP = frozenset(["the", "and", "for", "with", "not", "per", "are", "was", "you", "your", "have", "has", "any", "all", "can"])


def _flat(text: str) -> str:
    return " ".join(text.casefold().split())


def _numbers(text: str) -> set[str]:
    found = {d.replace(",", "") for d in _DIGITS.findall(text)}
    for spelled in _CN_NUMBER.findall(text):
        value = _cn_to_int(spelled)
        if value is not None and (len(spelled) > 1 or value >= 10):
            found.add(str(value))
    return found


def check_grounded(value: str, quote: str, said: str) -> str | None:
    """Why a constraint's ``value``/``quote`` is not what the user ``said``, or ``None`` if it is.

    The quote must be non-empty, free of markup and part of the user's words; every
    number of the value must be one the user said (``两百`` counts as ``200``); at least
    half of the value's words (Latin words of 3+ letters, Chinese characters) must
    appear in what the user said. So the prompt's own examples, invented or markup
    quotes and made-up numbers are caught.
    """
    said_flat = _flat(said)
    quote_flat = _flat(quote.strip().strip("\"'“”‘’「」"))
    if not quote_flat:
        return "empty quote"
    if _TAG.search(quote) or "```" in quote:
        return f"markup in the quote {quote[:40]!r}"
    if quote_flat not in said_flat:
        return f"the quote {quote[:40]!r} is not in the user's words"
    missing = _numbers(value) - _numbers(said)
    if missing:
        return f"the value {value[:40]!r} has numbers the user never said ({', '.join(sorted(missing))})"
    value_flat = _flat(value)
    words = [w for w in _WORD.findall(value_flat) if w not in _STOP] + _CJK.findall(value_flat)
    if words and sum(w in said_flat for w in words) * 2 < len(words):
        return f"the value {value[:40]!r} is not in the user's words"
    return None


class LLMConstraintExtractor:
    """`ConstraintExtractor` asking for one JSON object with a schema.

    The answer is parsed tolerantly, then rejected whole (`OutputRejected`) when it
    fails the schema or any value is not grounded in the user's words (`check_grounded`).
    """

    def __init__(
        self,
        model: ChatModel,
        *,
        fallback: ConstraintExtractor | None = None,
        max_tokens: int | None = LLMLimits.constraints,
        max_value_chars: int = 200,
        timeout: float | None = 60.0,
        prompt: Prompt = CONSTRAINTS,
        window: ModelWindow | None = None,
    ) -> None:
        """With the model's ``window``, a call that would not fit has the message cut (its start
        kept), then the list of what is remembered."""
        self.model, self.fallback, self.prompt = model, fallback, prompt
        self.max_tokens, self.max_value_chars, self.timeout = max_tokens, max_value_chars, timeout
        self.window = window

    async def extract(self, turn: Turn, current: Sequence[Constraint]) -> ConstraintUpdate:
        if turn.role != "user" or not turn.content.strip():
            return ConstraintUpdate()
        chinese = is_chinese(turn.content)
        remembered = "\n".join(f"- {c.key}: {c.value}" for c in current) or ("（无）" if chinese else "(none)")
        try:
            answer = await _ask(
                self.model, self.prompt, chinese=chinese, max_tokens=self.max_tokens,
                timeout=self.timeout, read=CONSTRAINTS_SCHEMA,
                fit=(self.window, (("message", "head"), ("current", "head"))),
                current=remembered, message=turn.content,
            )
            return self._update(self._parse(answer), turn, current)
        except ModelError as exc:
            if self.fallback is None:
                raise
            logger.warning("constraint extraction failed (%s); using the fallback", exc)
            return await self.fallback.extract(turn, current)

    @staticmethod
    def _parse(answer: str) -> _ConstraintPayload:
        data = extract_json(answer)
        if data is None:
            raise OutputRejected(f"no JSON in the output ({' '.join(answer.split())[:60]!r})")
        try:
            return _ConstraintPayload.model_validate(_normalise_payload(data))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise OutputRejected(f"schema: {where}: {first['msg']}") from None

    def _update(self, payload: _ConstraintPayload, turn: Turn, current: Sequence[Constraint]) -> ConstraintUpdate:
        found: dict[str, Constraint] = {}
        for item in payload.upsert:
            key, value = _norm_key(item.key), " ".join(item.value.split())[: self.max_value_chars]
            if not key or _TAG.search(key):
                raise OutputRejected(f"schema: the key {item.key[:40]!r} is empty or holds markup")
            if (why := check_grounded(value, item.quote, turn.content)) is not None:
                raise OutputRejected(f"{key}: {why}")
            found[key] = Constraint(
                key=key, value=value, kind=item.kind, source_seq=turn.seq,
                quote=item.quote.strip(),
            )
        # Only what is remembered can be removed (a copied example must not delete anything).
        known = {c.key for c in current}
        removed = [k for k in dict.fromkeys(_norm_key(k) for k in payload.remove) if k in known and k not in found]
        return ConstraintUpdate(upsert=tuple(found.values()), remove_keys=tuple(removed))


class LLMEmotionScorer:
    """`EmotionScorer` asking for an intensity in 0–1, clamped."""

    def __init__(
        self,
        model: ChatModel,
        *,
        fallback: EmotionScorer | None = None,
        max_tokens: int | None = LLMLimits.emotion,
        text_chars: int = 2000,
        timeout: float | None = 30.0,
        prompt: Prompt = EMOTION,
        window: ModelWindow | None = None,
    ) -> None:
        """The text is cut to ``text_chars`` characters, and with the model's ``window`` further
        (its start kept) when the call would not fit."""
        self.model, self.fallback, self.prompt = model, fallback, prompt
        self.max_tokens, self.text_chars, self.timeout = max_tokens, text_chars, timeout
        self.window = window

    async def score(self, text: str) -> float:
        if not text.strip():
            return 0.0
        try:
            answer = await _ask(
                self.model, self.prompt, chinese=is_chinese(text), max_tokens=self.max_tokens,
                timeout=self.timeout, read=EMOTION_SCHEMA, fit=(self.window, (("text", "head"),)),
                text=text[: self.text_chars],
            )
            value = parse_intensity(answer)
            if value is None:
                raise OutputRejected(f"no intensity in the output ({' '.join(answer.split())[:60]!r})")
        except ModelError as exc:
            if self.fallback is None:
                raise
            logger.warning("emotion scoring failed (%s); using the fallback", exc)
            return await self.fallback.score(text)
        return value
