"""Summary jobs across attempts and workers, in one process on the memory store.

The multi-process tests (`tests/service/test_multiworker.py`) prove single-flight under load; these
pin the two cases that could make a summary be computed twice for one range.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from contextmode.engine import Engine, Processors
from contextmode.jobs import JobRunner, JobSettings
from contextmode.memory import get_strategy
from contextmode.processors.base import ConstraintUpdate, Detection, Rewrite, SummaryResult
from contextmode.settings import EngineSettings
from contextmode.store import MemoryStore
from contextmode.testing import CharTokenCounter, FunctionModel
from contextmode.types import ChatMessage, Constraint, NewTurn, SessionKey, Summary, Turn

T, S = "t", "s"

COVERS = 20 - get_strategy(EngineSettings().strategy).recent_turns
"""What a summary covers after 20 turns: all but the default strategy's recent window."""


class CountingSummarizer:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    async def summarize(self, previous: Summary | None, turns: Sequence[Turn]) -> SummaryResult:
        self.calls.append((turns[0].seq, turns[-1].seq))
        return SummaryResult(text=f"1-{turns[-1].seq}")


class SlowFirstCommit(MemoryStore):
    """The first summary commit hangs past the job's timeout (a stalled database)."""

    def __init__(self) -> None:
        super().__init__()
        self.stalled = 0

    async def commit_summary(self, key: SessionKey, summary: Summary, *, expected_version: int) -> bool:
        if not self.stalled:
            self.stalled += 1
            await asyncio.sleep(30)
        return await super().commit_summary(key, summary, expected_version=expected_version)


class _Nothing:
    async def detect(self, message: str, history: Sequence[Turn]) -> Detection:
        return Detection(needs_context=False)

    async def rewrite(self, message: str, history: Sequence[Turn], *, summary: str | None = None) -> Rewrite:
        return Rewrite(text=message, changed=False, source="test")

    async def extract(self, turn: Turn, current: Sequence[Constraint]) -> ConstraintUpdate:
        return ConstraintUpdate()

    async def score(self, text: str) -> float:
        return 0.0


def _engine(store: MemoryStore, summarizer: CountingSummarizer, jobs: JobRunner) -> Engine:
    def reply(messages: Sequence[ChatMessage]) -> list[str]:
        return ["ok"]

    nothing = _Nothing()
    return Engine(
        store=store, model=FunctionModel(reply), counter=CharTokenCounter(),
        processors=Processors(detector=nothing, rewriter=nothing, summarizer=summarizer, extractor=nothing, emotion=nothing),
        settings=EngineSettings(summary_threshold=4, strategy="default"), jobs=jobs,
    )


async def _fill(store: MemoryStore, n: int) -> None:
    turns = [NewTurn(role="user" if i % 2 == 0 else "assistant", content=f"turn {i + 1}", tokens=3) for i in range(n)]
    await store.append(SessionKey(T, S), turns)


async def test_an_attempt_cut_off_in_its_commit_is_not_summarised_again() -> None:
    store = SlowFirstCommit()
    summarizer = CountingSummarizer()
    jobs = JobRunner(store, JobSettings(timeout_s=0.2, lock_ttl_s=5, base_delay_s=0, attempts=3))
    engine = _engine(store, summarizer, jobs)
    await _fill(store, 20)
    jobs.schedule(T, S, "summary", lambda: engine.summarize_now(T, S))
    await engine.drain()
    info = await store.info(SessionKey(T, S))
    assert info is not None and info.summary_version == 1
    assert info.summary_covers_seq == COVERS  # 20 turns, the default's recent window kept verbatim
    assert summarizer.calls == [(1, COVERS)], "the summary computed before the stall was thrown away"
    assert info.jobs["summary"].ok == 1


async def test_two_workers_on_one_store_summarise_each_range_once() -> None:
    store = MemoryStore()
    summarizer = CountingSummarizer()
    workers = [
        _engine(store, summarizer, JobRunner(store, JobSettings(base_delay_s=0.001, lock_ttl_s=5, timeout_s=2)))
        for _ in range(2)
    ]
    await _fill(store, 20)
    for engine in workers * 3:  # both "workers" schedule the same due summary three times
        engine.jobs.schedule(T, S, "summary", lambda e=engine: e.summarize_now(T, S))  # type: ignore[misc]
    await asyncio.gather(*(engine.drain() for engine in workers))
    info = await store.info(SessionKey(T, S))
    assert info is not None and info.summary_version == 1 and summarizer.calls == [(1, COVERS)]
