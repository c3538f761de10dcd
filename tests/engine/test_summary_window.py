"""A summary job never asks more of the model than its context window (issue 14).

The stub server acts as llama-cpp-python's (``llamacpp_window``): it says its window in ``/props``,
counts tokens at ``/tokenize`` and refuses a request whose prompt plus ``max_tokens`` exceeds
the window, as the real server does.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace

import pytest

from contextmode.api import build_engine
from contextmode.engine import Engine, Processors
from contextmode.errors import ModelError
from contextmode.memory.strategies import get_strategy
from contextmode.models.openai import OpenAIChatModel, OpenAIOptions
from contextmode.processors.audit import AuditedSummarizer
from contextmode.processors.base import fits_a_window
from contextmode.processors.llm import LLMSummarizer
from contextmode.processors.summarize import OfflineSummarizer
from contextmode.settings import EngineSettings
from contextmode.store import MemoryStore
from contextmode.testing.stub_server import StubRequest, StubServer
from contextmode.types import NewTurn, SessionKey

T, S = "t", "s"
RECENT = get_strategy("default").recent_turns
WORDS = ("river", "garden", "lantern", "harbor", "meadow", "pepper", "violet", "canyon", "orchard", "thimble")


def _long_text(index: int, words: int = 320) -> str:
    """About ``words`` tokens (one per word for the stub's counter), distinct per turn, no numbers."""
    cycle = itertools.cycle(WORDS[index % len(WORDS):] + WORDS[: index % len(WORDS)])
    return f"turn{chr(97 + index % 26)}{chr(97 + index // 26)} " + " ".join(next(cycle) for _ in range(words))


def _summaries() -> Iterator[str]:
    for n in itertools.count(1):
        yield f"Part {n} of the talk covered gardens and rivers."


def _engine(url: str, *, max_tokens: int = 512) -> Engine:
    model = OpenAIChatModel(model="smollm2", base_url=url, max_retries=0, options=OpenAIOptions(reply_max_tokens=256))
    summarizer = AuditedSummarizer(LLMSummarizer(model, max_tokens=max_tokens, timeout=30))
    # The summary due by count (the ``default`` strategy's window of six turns).
    return build_engine(store=MemoryStore(), model=model, settings=EngineSettings(strategy="default"),
                        processors=replace(Processors.offline(), summarizer=summarizer))


async def _append(engine: Engine, texts: list[str]) -> None:
    turns = [NewTurn(role="user" if i % 2 == 0 else "assistant", content=text, tokens=engine.counter.count(text))
             for i, text in enumerate(texts)]
    await engine.store.append(SessionKey(T, S), turns)


def _summary_calls(server: StubServer) -> list[StubRequest]:
    return [r for r in server.chat_requests if "<new_turns>" in r.last_user]


@pytest.fixture
def server() -> Iterator[StubServer]:
    answers = _summaries()
    stub = StubServer(lambda request: next(answers), model="smollm2", llamacpp_window=4096)
    with stub:
        yield stub


async def test_many_long_turns_are_folded_in_chunks_that_fit_the_window(server: StubServer) -> None:
    engine = _engine(server.url)
    assert engine.settings.context_window == 4096  # from the server's /props
    texts = [_long_text(i) for i in range(40)]  # ~13,000 tokens of turns: three times the window
    await _append(engine, texts)
    assert await engine.summarize_now(T, S)
    calls = _summary_calls(server)
    assert server.overflows == []  # no request was refused as larger than the window
    assert len(calls) >= 4
    for call in calls:
        assert server._usage(call, "")["prompt_tokens"] + call.body["max_tokens"] <= 4096
    state = await engine.store.load(SessionKey(T, S), recent=0)
    assert state.summary is not None
    assert state.summary.covers_seq == 40 - RECENT  # every turn outside the recent window
    assert state.summary.version == len(calls)  # one commit per chunk
    # Each turn went to the model once, in order, and each call folded the previous call's summary.
    seen = [i for call in calls for i, text in enumerate(texts) if text.split()[0] in call.last_user]
    assert seen == list(range(40 - RECENT))
    assert "Part 1 of the talk" in calls[1].last_user
    await engine.close()


async def test_a_failure_half_way_keeps_the_committed_chunks(server: StubServer) -> None:
    engine = _engine(server.url)
    texts = [_long_text(i) for i in range(40)]
    await _append(engine, texts)
    answers = _summaries()
    replies = iter([next(answers), next(answers)])

    def two_then_down(request: StubRequest) -> str:
        return next(replies)  # a StopIteration on the third call: the stub answers 500

    server.reply = two_then_down
    with pytest.raises(ModelError):
        await engine.summarize_now(T, S)
    state = await engine.store.load(SessionKey(T, S), recent=0)
    assert state.summary is not None and state.summary.version == 2  # two chunks committed
    done = state.summary.covers_seq
    assert 0 < done < 40 - RECENT
    # The retry starts after the committed chunks: the turns they covered are not sent again.
    server.reset()
    server.reply = lambda request: next(answers)
    assert await engine.summarize_now(T, S)
    retried = _summary_calls(server)
    assert texts[done - 1].split()[0] not in retried[0].last_user
    assert texts[done].split()[0] in retried[0].last_user
    assert "Part 2 of the talk" in retried[0].last_user  # folded into the committed summary
    state = await engine.store.load(SessionKey(T, S), recent=0)
    assert state.summary is not None and state.summary.covers_seq == 40 - RECENT
    assert server.overflows == []
    await engine.close()


async def test_a_turn_longer_than_the_window_is_cut_to_fit() -> None:
    answers = _summaries()
    stub = StubServer(lambda request: next(answers), model="smollm2", llamacpp_window=1024)
    with stub as url:
        engine = _engine(url)
        engine.processors.summarizer.inner.turn_chars = 100_000  # type: ignore[attr-defined]
        await _append(engine, [_long_text(0, words=3000), *(_long_text(i, 20) for i in range(1, 12))])
        assert await engine.summarize_now(T, S, force=True)
        assert stub.overflows == []
        first = _summary_calls(stub)[0]
        assert "turnaa" in first.last_user and "turnba" not in first.last_user  # the long turn alone, cut
        state = await engine.store.load(SessionKey(T, S), recent=0)
        assert state.summary is not None and state.summary.covers_seq == 12 - RECENT
        await engine.close()


async def test_before_the_fix_the_same_job_overflowed_the_window(server: StubServer) -> None:
    """The regression this guards: every due turn in one call is refused by the server."""
    model = OpenAIChatModel(model="smollm2", base_url=server.url, max_retries=0)
    summarizer = LLMSummarizer(model, timeout=30)
    texts = [_long_text(i) for i in range(12)]
    engine = _engine(server.url)
    await _append(engine, texts)
    turns = await engine.store.turns(SessionKey(T, S), from_seq=1, to_seq=12)
    with pytest.raises(ModelError, match="maximum context length is 4096"):
        await summarizer.summarize(None, turns)
    assert server.overflows and server.overflows[0] > 4096
    await engine.close()


def test_only_a_summariser_with_a_window_is_chunked() -> None:
    from contextmode.testing import CharTokenCounter

    offline = AuditedSummarizer(OfflineSummarizer())
    assert fits_a_window(offline) and offline.call_tokens(None, [], CharTokenCounter()) is None
    assert not fits_a_window(OfflineSummarizer())
