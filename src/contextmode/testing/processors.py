"""Deterministic processor fakes for tests: no model, no randomness, no I/O.

Each satisfies one protocol of `contextmode.processors.base`, so an `Engine`
can run a whole turn offline:

- `KeywordDetector`: needs context exactly when the follow-up intent keywords match;
- `PrefixRewriter`: appends the last user message as ``（指：…）``;
- `JoiningSummarizer`: the previous summary plus the new turns joined by `` / ``;
- `SpiceExtractor`: pins ``spice = 不吃辣`` when a user says 不吃辣;
- `ExclamationEmotion` / `FlatEmotion`: fixed intensities (0–1).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from ..processors.base import ConstraintUpdate, Detection, Rewrite, SummaryResult
from ..processors.intents import classify_follow_up_intent
from ..types import Constraint, Summary, Turn

__all__ = [
    "ExclamationEmotion",
    "FlatEmotion",
    "JoiningSummarizer",
    "KeywordDetector",
    "PrefixRewriter",
    "SpiceExtractor",
]


class KeywordDetector:
    """`ContextDetector` fake: a follow-up intent keyword means the message needs context."""

    def __init__(self, reason: str = "") -> None:
        self.reason = reason
        """Put in every `Detection.reason`."""

    async def detect(self, message: str, history: Sequence[Turn]) -> Detection:
        intent = classify_follow_up_intent(message)
        return Detection(needs_context=intent is not None, intent=intent, reason=self.reason)


class PrefixRewriter:
    """`Rewriter` fake: always "changes" the message by naming the last user turn in
    brackets (words of the conversation only, so the verifier accepts it)."""

    async def rewrite(self, message: str, history: Sequence[Turn], *, summary: str | None = None) -> Rewrite:
        topic = next((t.content for t in reversed(history) if t.role == "user"), "")
        return Rewrite(text=f"{message}（{topic}）", changed=True, source="test")


class JoiningSummarizer:
    """`Summarizer` fake: previous text, a space, then the turns joined by `` / ``.

    Records ``(first seq, last seq)`` of every call in ``calls``; waits ``delay_s``
    seconds per call; the first ``failures`` calls raise `RuntimeError`.
    """

    def __init__(self, failures: int = 0, delay_s: float = 0.0) -> None:
        self.calls: list[tuple[int, int]] = []
        self.failures = failures
        self.delay_s = delay_s

    async def summarize(self, previous: Summary | None, turns: Sequence[Turn]) -> SummaryResult:
        self.calls.append((turns[0].seq, turns[-1].seq))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.failures:
            self.failures -= 1
            raise RuntimeError("summariser down")
        head = previous.text + " " if previous else ""
        return SummaryResult(text=head + " / ".join(t.content for t in turns))


class SpiceExtractor:
    """`ConstraintExtractor` fake: a turn containing 不吃辣 pins ``spice = 不吃辣``."""

    async def extract(self, turn: Turn, current: Sequence[Constraint]) -> ConstraintUpdate:
        if "不吃辣" in turn.content:
            return ConstraintUpdate(upsert=(Constraint(key="spice", value="不吃辣", source_seq=turn.seq),))
        return ConstraintUpdate()


class ExclamationEmotion:
    """`EmotionScorer` fake: 0.9 for text with ``!`` or ``！`` (a key moment), else 0.1."""

    async def score(self, text: str) -> float:
        return 0.9 if "!" in text or "！" in text else 0.1


class FlatEmotion:
    """`EmotionScorer` fake: the same intensity (default 0.1) for every text."""

    def __init__(self, value: float = 0.1) -> None:
        self.value = value

    async def score(self, text: str) -> float:
        return self.value
