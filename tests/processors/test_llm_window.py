"""Every LLM processor's call fits the model's context window (issue 14).

The stub acts as llama-cpp-python's server (``llamacpp_window``): it refuses a request whose
prompt plus ``max_tokens`` exceeds its window, and `StubServer.overflows` lists those.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from contextmode.api import build_engine
from contextmode.errors import ConfigError, ContextWindowExceeded
from contextmode.models.openai import OpenAIChatModel, OpenAIOptions
from contextmode.processors.llm import (
    LLMConstraintExtractor,
    LLMContextDetector,
    LLMEmotionScorer,
    LLMRewriter,
)
from contextmode.processors.window import ModelWindow, fit_fields, usable_tokens
from contextmode.prompts import REWRITE
from contextmode.store import MemoryStore
from contextmode.testing import CharTokenCounter
from contextmode.testing.stub_server import StubRequest, StubServer
from contextmode.types import Turn

WINDOW = 1024
LONG = " ".join(f"word{i}" for i in range(3000))  # 3,000 tokens for the stub's counter


def _answer(request: StubRequest) -> str:
    body = request.body if isinstance(request.body, dict) else {}
    if body.get("response_format"):
        if "intensity" in json.dumps(body["response_format"]):
            return '{"intensity": 0.4}'
        return '{"upsert": [{"key": "diet", "value": "vegetarian", "kind": "preference", "quote": "I am vegetarian"}], "remove": []}'
    return "yes"


@pytest.fixture
def stub() -> Iterator[StubServer]:
    server = StubServer(_answer, model="smollm2", llamacpp_window=WINDOW)
    with server:
        yield server


def _model(stub: StubServer) -> OpenAIChatModel:
    return OpenAIChatModel(model="smollm2", base_url=stub.url, max_retries=0)


def _window() -> ModelWindow:
    return ModelWindow(tokens=WINDOW, counter=CharTokenCounter())


def _turn(seq: int, role: str, text: str) -> Turn:
    return Turn(seq=seq, role=role, content=text, tokens=CharTokenCounter().count(text),  # type: ignore[arg-type]
                created_at=datetime(2026, 12, 3, tzinfo=UTC))


def _history() -> list[Turn]:
    return [_turn(i, "user" if i % 2 else "assistant", f"turn{i} {LONG}") for i in range(1, 9)]


async def test_the_detector_cuts_history_then_message_to_fit(stub: StubServer) -> None:
    detector = LLMContextDetector(_model(stub), window=_window())
    detection = await detector.detect(LONG + " what about it?", _history())
    assert stub.overflows == [] and len(stub.chat_requests) == 1
    assert detection.needs_context and detection.reason.startswith("detect@")  # the model's verdict
    assert "what about it?" in stub.chat_requests[0].last_user  # the message's end kept


async def test_without_a_window_the_same_call_is_refused_by_the_server(stub: StubServer) -> None:
    detector = LLMContextDetector(_model(stub))
    detection = await detector.detect(LONG, _history())
    assert stub.overflows and stub.overflows[0] > WINDOW
    assert not detection.reason.startswith("detect@")  # it fell back


async def test_the_rewriter_cuts_summary_and_history_but_never_the_message(stub: StubServer) -> None:
    rewriter = LLMRewriter(_model(stub), window=_window(), turn_chars=2000)
    await rewriter.rewrite("Where is it?", _history(), summary=LONG)
    assert stub.overflows == [] and len(stub.chat_requests) == 1
    sent = stub.chat_requests[0].last_user
    assert "Where is it?" in sent and "turn8 " in sent  # the newest turn kept
    assert "turn1 " not in sent and "word2999" not in sent  # the oldest and the summary's end cut
    # A message that alone does not fit is kept as it is, and nothing is sent.
    result = await rewriter.rewrite(LONG, _history(), summary="short")
    assert (result.text, result.changed) == (LONG, False)
    assert len(stub.chat_requests) == 1 and stub.overflows == []


async def test_the_extractor_and_the_emotion_scorer_cut_a_long_message(stub: StubServer) -> None:
    said = "I am vegetarian. " + LONG
    update = await LLMConstraintExtractor(_model(stub), window=_window()).extract(_turn(1, "user", said), [])
    assert [c.value for c in update.upsert] == ["vegetarian"]  # grounded in the whole message
    scorer = LLMEmotionScorer(_model(stub), window=_window(), text_chars=100_000)
    assert await scorer.score(LONG) == pytest.approx(0.4)
    assert stub.overflows == [] and len(stub.chat_requests) == 2


def test_fitting_cuts_only_as_far_as_needed_and_says_when_it_cannot() -> None:
    window = _window()
    fields = {"message": "Where is it?", "summary": "(none)", "history": LONG}
    fitted = fit_fields(window, REWRITE, fields, chinese=False, max_tokens=128, cuts=[("history", "tail")])
    cost = window.cost(REWRITE.render(chinese=False, **fitted), 128)
    assert usable_tokens(WINDOW) - 8 <= cost <= usable_tokens(WINDOW)  # cut to the limit, not below
    assert str(fitted["history"]).startswith("…") and str(fitted["history"]).endswith("word2999")
    short = {"message": "Where is it?", "summary": "(none)", "history": "User: hi"}
    assert fit_fields(window, REWRITE, short, chinese=False, max_tokens=128) == short
    with pytest.raises(ContextWindowExceeded, match=r"rewrite@\d+ call takes \d+ tokens .* 1024-token"):
        fit_fields(window, REWRITE, fields | {"message": LONG}, chinese=False, max_tokens=128,
                   cuts=[("history", "tail")])


def test_build_engine_gives_the_processors_the_window_and_reserves_the_reply(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CONTEXTMODE_CONTEXT_WINDOW", raising=False)
    monkeypatch.delenv("CONTEXTMODE_REPLY_RESERVE", raising=False)
    server = StubServer(model="smollm2", llamacpp_window=2048)
    with server as url:
        model = OpenAIChatModel(model="smollm2", base_url=url, max_retries=0)  # replies capped at 1024
        engine = build_engine(store=MemoryStore(), model=model, processors="llm")
        assert engine.processors.detector.window == ModelWindow(tokens=2048, counter=engine.counter)  # type: ignore[attr-defined]
        # A quarter of the window (512) would let the context plus a 1024-token reply overflow it.
        assert engine.budget().input_tokens == 2048 - 1024
        capped = OpenAIChatModel(model="smollm2", base_url=url, max_retries=0,
                                 options=OpenAIOptions(reply_max_tokens=256))
        assert build_engine(store=MemoryStore(), model=capped).budget().input_tokens == 2048 - 512
        too_long = OpenAIChatModel(model="smollm2", base_url=url, max_retries=0,
                                   options=OpenAIOptions(reply_max_tokens=4096))
        with pytest.raises(ConfigError, match=r"reply cap is 4096 tokens .* window is 2048"):
            build_engine(store=MemoryStore(), model=too_long)
