"""The shipped processor fakes behave as their docstrings say."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from contextmode.testing.processors import (
    ExclamationEmotion,
    FlatEmotion,
    JoiningSummarizer,
    KeywordDetector,
    PrefixRewriter,
    SpiceExtractor,
)
from contextmode.types import Summary, Turn

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def turn(seq: int, content: str, role: str = "user") -> Turn:
    return Turn(seq=seq, role=role, content=content, tokens=len(content), created_at=T0)  # type: ignore[arg-type]


async def test_keyword_detector_and_prefix_rewriter() -> None:
    history = [turn(1, "红烧肉怎么做"), turn(2, "先焯水……", "assistant")]
    detection = await KeywordDetector(reason="keyword").detect("再详细一点", history)
    assert detection.needs_context and detection.intent is not None and detection.reason == "keyword"
    assert not (await KeywordDetector().detect("今天天气怎么样", history)).needs_context
    rewrite = await PrefixRewriter().rewrite("再详细一点", history)
    assert rewrite.text == "再详细一点（红烧肉怎么做）" and rewrite.changed


async def test_joining_summarizer_records_calls_and_fails_on_request() -> None:
    summarizer = JoiningSummarizer(failures=1)
    with pytest.raises(RuntimeError):
        await summarizer.summarize(None, [turn(1, "甲")])
    previous = Summary(text="旧", covers_seq=1, tokens=1, version=1, created_at=T0)
    result = await summarizer.summarize(previous, [turn(2, "乙"), turn(3, "丙")])
    assert result.text == "旧 乙 / 丙"
    assert summarizer.calls == [(1, 1), (2, 3)]


async def test_spice_extractor_and_emotions() -> None:
    update = await SpiceExtractor().extract(turn(4, "我不吃辣"), [])
    assert [(c.key, c.value, c.source_seq) for c in update.upsert] == [("spice", "不吃辣", 4)]
    assert (await SpiceExtractor().extract(turn(5, "都行"), [])).upsert == ()
    assert await ExclamationEmotion().score("太好了！") == pytest.approx(0.9)
    assert await ExclamationEmotion().score("好的") == pytest.approx(0.1)
    assert await FlatEmotion().score("太好了！") == pytest.approx(0.1)
