"""Warm-up: load, before the first turn, what the first turn would otherwise load.

A cold process pays once for jieba's dictionary, tagger and keyword table, the shipped
detector, fact scorer and emotion lexicons and the recall text analysis (about a second on a loaded
two-core machine). `warm_up` runs each model-free processor once on a sample exchange in
Chinese and English, so the service's first context after a restart costs what the next
ones do. A processor that may call a model is skipped: warming up never calls a model and
writes nothing.
"""

from __future__ import annotations

import time
from typing import Protocol

from ..processors.base import calls_no_model
from ..tokens.base import TokenCounter
from ..types import Turn, utc_now
from .seams import Processors

__all__ = ["Warmable", "warm_up"]


class Warmable(Protocol):
    """What warming up runs: the processors and the token counter (an `Engine`, a `TurnParts`)."""

    @property
    def processors(self) -> Processors: ...

    @property
    def counter(self) -> TokenCounter: ...

_SAMPLE_USER = "我不吃辣，预算五十元以内，对花生过敏！I live in Boston and my budget is $20."
_SAMPLE_ANSWER = "好的，推荐西湖边的那家店。The one by the lake is quiet."
_SAMPLE_MESSAGE = "那家店在哪里？举个例子。Where is it?"


async def warm_up(engine: Warmable) -> float:
    """Run the engine's model-free processors, its token counter and the recall text
    analysis once on a sample exchange; the time it took, milliseconds."""
    from ..text.index_terms import analyze

    started = time.perf_counter()
    now = utc_now()
    history = (
        Turn(seq=1, role="user", content=_SAMPLE_USER, tokens=0, created_at=now),
        Turn(seq=2, role="assistant", content=_SAMPLE_ANSWER, tokens=0, created_at=now),
    )
    for text in (_SAMPLE_USER, _SAMPLE_ANSWER, _SAMPLE_MESSAGE):
        engine.counter.count(text)
        analyze(text)
    if calls_no_model(engine.processors.detector):
        await engine.processors.detector.detect(_SAMPLE_MESSAGE, history)
    if calls_no_model(engine.processors.rewriter):
        await engine.processors.rewriter.rewrite(_SAMPLE_MESSAGE, history)
    if calls_no_model(engine.processors.extractor):
        await engine.processors.extractor.extract(history[0], ())
    if calls_no_model(engine.processors.emotion):
        await engine.processors.emotion.score(_SAMPLE_USER)
    if calls_no_model(engine.processors.summarizer):  # its keyword table (the first summary job's load)
        await engine.processors.summarizer.summarize(None, history)
    return (time.perf_counter() - started) * 1000
