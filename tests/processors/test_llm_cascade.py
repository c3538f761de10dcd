"""The LLM processors ask the model only what it is needed for, and stop it once they have it:
the detector's cascade, the rewriter's one line within its budget, a background answer that
degenerates (issue 41)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime

import pytest

from contextmode.errors import ModelTimeout, OutputRejected
from contextmode.models.priority import PriorityGate, in_background, paused_limits
from contextmode.processors.base import Detection
from contextmode.processors.detect import DetectorModel, OfflineContextDetector
from contextmode.processors.llm import (
    LLMContextDetector,
    LLMEmotionScorer,
    LLMLimits,
    LLMRewriter,
    LLMSummarizer,
    rewrite_budget,
    verdict_given,
)
from contextmode.processors.window import ModelWindow
from contextmode.testing import CharTokenCounter
from contextmode.testing.models import FunctionModel, ScriptedModel
from contextmode.types import ChatMessage, Turn


def turn(seq: int, role: str, content: str) -> Turn:
    return Turn(seq=seq, role=role, content=content, tokens=len(content),  # type: ignore[arg-type]
                created_at=datetime(2026, 6, 9, 10, seq, tzinfo=UTC))


HISTORY = [
    turn(1, "user", "空调制冷差怎么办?"),
    turn(2, "assistant", "可以尝试：1. 清洗滤网；2. 开启极速制冷按钮；3. 检查室外机。"),
]
EN_HISTORY = [turn(1, "user", "My AC cools badly."), turn(2, "assistant", "Clean the filter first.")]


def _constant(p: float) -> DetectorModel:
    """A detector model giving every message probability ``p``."""
    import math

    return DetectorModel(buckets=8, weights={}, intercept=math.log(p / (1 - p)))


class _Counted:
    """Chunks of a streamed answer, counting how many the reader took."""

    def __init__(self, chunks: Sequence[str]) -> None:
        self.chunks, self.taken = chunks, 0

    def __iter__(self) -> Iterator[str]:
        for chunk in self.chunks:
            self.taken += 1
            yield chunk


# -- the offline detector says when it is sure --------------------------------------------------

@pytest.mark.parametrize(("p", "message", "sure"), [
    (0.05, "How do I bake bread at home?", True),    # clearly standalone
    (0.95, "How do I bake bread at home?", True),    # clearly a follow-up
    (0.5, "How do I bake bread at home?", False),    # in the unsure band
    (0.05, "what about the second one?", False),     # a cue the model disagrees with
    (0.05, "give me an example", True),              # a template intent decides
])
def test_the_offline_detector_is_sure_only_outside_its_band(p: float, message: str, sure: bool) -> None:
    detection = OfflineContextDetector(_constant(p)).detect_texts(message, ["My AC cools badly.", "Clean it."])
    assert detection.sure is sure


# -- the cascade --------------------------------------------------------------------------------

async def test_a_sure_offline_verdict_is_taken_without_a_model_call() -> None:
    model = ScriptedModel([])
    detector = LLMContextDetector(model, fallback=OfflineContextDetector(_constant(0.05)))
    detection = await detector.detect("How do I bake bread at home?", EN_HISTORY)
    assert not detection.needs_context and detection.reason.startswith("offline, sure: model p=0.05")
    example = await detector.detect("举个例子", HISTORY)  # a template intent, whatever the probability
    assert example.needs_context and example.intent == "example" and example.reason.startswith("offline, sure")
    assert model.calls == []


async def test_an_unsure_offline_verdict_goes_to_the_model_and_the_reason_says_so() -> None:
    model = ScriptedModel(["yes", ModelTimeout("slow")])
    detector = LLMContextDetector(model, fallback=OfflineContextDetector(_constant(0.45)))
    detection = await detector.detect("How do I bake bread at home?", EN_HISTORY)
    assert detection.needs_context and detection.reason == "detect@1: yes (offline unsure: model p=0.45)"
    failed = await detector.detect("How do I bake bread at home?", EN_HISTORY)  # the model fails: offline
    assert not failed.needs_context and failed.reason == "offline, the model gave no verdict: model p=0.45"
    assert len(model.calls) == 2


async def test_without_a_fallback_every_message_with_history_asks_the_model() -> None:
    model = ScriptedModel(["no"])
    detection = await LLMContextDetector(model).detect("举个例子", HISTORY)
    assert not detection.needs_context and len(model.calls) == 1


# -- the detector stops at its verdict ----------------------------------------------------------

@pytest.mark.parametrize(("answer", "given"), [
    ("yes", False), ("yes,", True), ("no ", True), ("nothing", False), ("noth", False), ("不需要。", True),
    ("The answer is", False), ("The answer is no.", True), ("Yes", False),
])
def test_a_verdict_is_given_once_its_word_is_finished(answer: str, given: bool) -> None:
    assert verdict_given(answer) is given


async def test_the_detector_stops_reading_once_the_verdict_is_in() -> None:
    chunks = _Counted(["Yes", ",", " the", " message", " refers", " to", " the", " filter", "."])
    model = ScriptedModel([chunks])
    detection = await LLMContextDetector(model).detect("那个呢?", HISTORY)
    assert detection.needs_context and chunks.taken == 2
    assert model.calls[0].method == "stream" and model.calls[0].max_tokens == LLMLimits.detect


# -- the rewriter: one line, within what a rewrite can be ---------------------------------------

async def test_the_rewriter_stops_after_the_line_holding_the_question() -> None:
    chunks = _Counted(["Rewritten question:", "\n", "Where is the", " filter of the AC?", "\n",
                       "Explanation:", " it", " names", " the", " filter", "\n"])
    model = ScriptedModel([chunks])
    rewrite = await LLMRewriter(model).rewrite("Where is it?", EN_HISTORY)
    assert rewrite.text == "Where is the filter of the AC?" and rewrite.changed
    assert chunks.taken == 5


def test_the_rewrite_budget_grows_with_the_message_and_stays_under_the_cap() -> None:
    counter = CharTokenCounter()
    short = rewrite_budget("Where is it?", chinese=False, counter=counter)
    longer = rewrite_budget("Where is it? Where is it?", chinese=False, counter=counter)
    assert 16 < short < longer
    # Without a counter: one token per UTF-8 byte, never fewer than a counter would say.
    assert rewrite_budget("Where is it?", chinese=False) >= short
    assert rewrite_budget("它在哪?", chinese=True) > rewrite_budget("它在哪?", chinese=True, counter=counter)


async def test_the_rewriter_asks_for_its_budget_never_above_its_cap() -> None:
    model = ScriptedModel(["Where is the filter?", "Where is the filter?"])
    window = ModelWindow(tokens=4096, counter=CharTokenCounter())
    await LLMRewriter(model, window=window).rewrite("Where is it?", EN_HISTORY)
    await LLMRewriter(model, window=window, max_tokens=20).rewrite("Where is it?", EN_HISTORY)
    budget = rewrite_budget("Where is it?", chinese=False, counter=CharTokenCounter())
    assert budget < LLMLimits.rewrite
    assert [c.max_tokens for c in model.calls] == [budget, 20]


# -- a background answer that degenerates is stopped and rejected -------------------------------

async def test_a_looping_summary_is_stopped_early_and_rejected() -> None:
    loop = _Counted(["用户想买空调，预算三千元。"] + ["用户喜欢空调。"] * 400)
    model = ScriptedModel([loop])
    with pytest.raises(OutputRejected, match="degenerated"):
        await LLMSummarizer(model).summarize(None, [turn(1, "user", "我想买空调，预算三千元")])
    assert loop.taken < 100  # not read to its end (the model's cap)


async def test_a_summary_drifting_into_phrases_said_over_and_over_is_rejected() -> None:
    # Not a verbatim loop: a number changes each time (the reply guard's near-loop check).
    drift = _Counted(["The user wants an AC. "] + [f"The user likes item {i} a lot. " for i in range(300)])
    model = ScriptedModel([drift])
    with pytest.raises(OutputRejected, match="degenerated"):
        await LLMSummarizer(model).summarize(None, [turn(1, "user", "I want an AC for 3000 yuan")])
    assert drift.taken < 300


async def test_a_sound_summary_is_read_whole() -> None:
    model = ScriptedModel([["User wants an AC, budget 3000 yuan.", "\nUser lives in the south."]])
    result = await LLMSummarizer(model).summarize(None, [turn(1, "user", "I want an AC for 3000 yuan")])
    assert result.text == "User wants an AC, budget 3000 yuan.\nUser lives in the south."
    assert model.calls[0].method == "stream"


def test_detection_is_unsure_unless_a_detector_says_otherwise() -> None:
    assert Detection(needs_context=True).sure is False


async def test_over_http_the_call_stopped_at_the_verdict_has_ended_when_detect_returns() -> None:
    pytest.importorskip("openai")
    import time

    from contextmode.models import OpenAIChatModel
    from contextmode.models.calls import call_log
    from contextmode.testing.stub_server import StubServer

    server = StubServer(lambda request: "Yes, the message refers to the filter of the air conditioner.")
    with server as url:
        model = OpenAIChatModel(model="stub-model", base_url=url, max_retries=0, timeout=2)
        started = time.monotonic()
        detection = await LLMContextDetector(model).detect("那个呢?", HISTORY)
        calls = call_log().between(started)
        await model.aclose()
    assert detection.needs_context and detection.reason.startswith("detect@")
    assert server.chat_requests[0].stream
    # Closed by the detector, not left running until the stream object is collected.
    assert [(c.step, c.outcome) for c in calls] == [("detect", "closed by the caller")]


async def test_a_background_processors_wait_for_a_slot_is_not_its_time() -> None:
    # Before, the scorer's 30 s timeout counted the wait for the one slot of a local server: on a
    # busy server the emotion job timed out waiting (three attempts, then failed) instead of being
    # deferred (`background_wait_s`, not a failure). Here a reply holds the slot four times the
    # scorer's limit; the call itself is well within it.
    gate = PriorityGate(1)
    await gate.acquire("reply")
    waiting = asyncio.Event()

    async def server(messages: tuple[ChatMessage, ...]) -> str:
        with paused_limits():  # as `OpenAIChatModel` waits for a background call's slot
            waiting.set()
            await gate.acquire("background")
        try:
            await asyncio.sleep(0.01)
            return '{"intensity": 0.8}'
        finally:
            gate.release("background")

    scorer = LLMEmotionScorer(FunctionModel(server), timeout=0.05)
    task = asyncio.create_task(in_background(scorer.score("I am so angry, the AC broke again!")))
    await waiting.wait()
    await asyncio.sleep(0.2)
    assert not task.done()
    gate.release("reply")
    assert await task == pytest.approx(0.8)


async def test_a_reply_processors_wait_for_a_slot_still_counts() -> None:
    # The response path stays bounded as a whole: the detector's wait is its time.
    gate = PriorityGate(1)
    await gate.acquire("reply")

    async def server(messages: tuple[ChatMessage, ...]) -> str:
        await gate.acquire("reply")
        return "yes"

    detector = LLMContextDetector(FunctionModel(server), timeout=0.05)
    detection = await detector.detect("And the second one?", EN_HISTORY)
    assert detection.needs_context is False and detection.reason == "llm gave no verdict"
