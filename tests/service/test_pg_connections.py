"""PostgreSQL pool acquisitions of a turn through the service, and no connection held while a
model works (issue #15: each acquisition costs the worker CPU).

A turn's lock, load, recall and user turn share one pooled connection (`Engine.one_connection`),
a burst of background jobs another; both are handed back before a model (the answer, or a
processor that is not `ModelFree`) works. Needs the PostgreSQL test server (skipped when
absent, failed under ``CI=true``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from contextmode.types import SessionKey

pytest.importorskip("fastapi")

from contextmode.api import build_engine
from contextmode.engine import Engine, Processors
from contextmode.processors.base import (
    ConstraintUpdate,
    Detection,
    PriorTurn,
    Rewrite,
    SummaryResult,
)
from contextmode.service import create_app
from contextmode.settings import EngineSettings
from contextmode.store.postgres import PostgresStore
from contextmode.testing import CharTokenCounter
from contextmode.testing.backends import fresh_store_url
from contextmode.testing.models import FunctionModel
from contextmode.types import ChatMessage, Constraint, Summary, Turn
from tests.service.test_service import client_for, make_settings, sse_events

pytestmark = pytest.mark.postgres

MESSAGES = [
    "I am planning a trip to Kyoto in April with my sister Lucy",
    "we like green tea and quiet temples",
    "what about the food there? I don't eat spicy food",
    "and the budget is two thousand dollars",
    "tell me more about the temples",
    "what did I say about my sister?",
]


@dataclass
class Pool:
    """The store's asyncpg pool, counting acquisitions; `in_use` reads the real pool."""

    pool: Any
    store: PostgresStore
    acquired: int = 0
    seen: list[tuple[str, int, bool]] = field(default_factory=list)
    """(who looked, connections in use, whether the looking task holds one) each time a model
    or a model-backed processor worked."""

    def acquire(self) -> Any:
        self.acquired += 1
        return self.pool.acquire()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pool, name)

    def in_use(self) -> int:
        return int(self.pool.get_size() - self.pool.get_idle_size())

    def look(self, who: str) -> None:
        # The task's shared-connection scope (`PostgresStore.one_connection`), if the store has one.
        scopes = getattr(self.store, "_scope", None)
        scope = scopes.get() if scopes is not None else None
        mine = scope is not None and scope.task is asyncio.current_task() and scope.db is not None
        self.seen.append((who, self.in_use(), mine))


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[PostgresStore]:
    async with fresh_store_url("postgres", tmp_path) as url:
        from contextmode.store.factory import open_store

        opened = open_store(url)
        assert isinstance(opened, PostgresStore)
        try:
            yield opened
        finally:
            await opened.close()


async def counting(store: PostgresStore) -> Pool:
    await store.version(SessionKey("local", "warm-up"))  # opens the pool
    pool = Pool(store.driver._pool, store)
    store.driver._pool = pool
    return pool


def answering(pool: Pool) -> FunctionModel:
    async def answer(messages: Sequence[ChatMessage]) -> AsyncIterator[str]:
        pool.look("model")
        yield "Kyoto is lovely in April; "
        await asyncio.sleep(0)
        pool.look("model")
        yield "the temples are quiet early in the morning."

    return FunctionModel(answer)


async def run_turns(engine: Engine, pool: Pool, tmp_path: Path, session: str) -> list[int]:
    """Each message as a turn through the service (whole and streamed in turn), its background
    jobs and trace write drained before the next; the acquisitions of each."""
    per_turn: list[int] = []
    async with client_for(create_app(engine, make_settings(tmp_path))) as client:
        for i, message in enumerate(MESSAGES):
            before = pool.acquired
            stream = i % 2 == 1
            reply = await client.post(f"/v1/sessions/{session}/messages", json={"message": message, "stream": stream})
            assert reply.status_code == 200, reply.text
            if stream:
                assert sse_events(reply.text)[-1] == "[DONE]"
            await engine.drain()
            per_turn.append(pool.acquired - before)
    return per_turn


async def test_a_turn_and_its_jobs_take_few_pooled_connections(store: PostgresStore, tmp_path: Path) -> None:
    """Offline processors and the default strategy (as ``benchmarks/load.py``): the turn lock,
    load, recall and user turn take one acquisition, the jobs' burst one; at most 6 per turn
    with the answer, the lock's release and the trace (11–12 when every call took its own)."""
    pool = await counting(store)
    engine = build_engine(store=store, model=answering(pool), counter=CharTokenCounter(),
                          processors=Processors.offline(), settings=EngineSettings())
    per_turn = await run_turns(engine, pool, tmp_path, "few")
    assert max(per_turn) <= 6, per_turn
    assert sum(per_turn) <= 5 * len(MESSAGES), per_turn
    turns = await store.turns(SessionKey("local", "few"))
    assert [t.role for t in turns] == ["user", "assistant"] * len(MESSAGES)
    assert [t.content for t in turns if t.role == "user"] == MESSAGES
    assert pool.seen and all(n == 0 for _, n, _ in pool.seen), pool.seen
    assert pool.in_use() == 0


# -- processors that stand for model-backed ones (not `ModelFree`): each looks at the pool --


class _Looking:
    def __init__(self, pool: Pool) -> None:
        self.pool = pool


class LookingDetector(_Looking):
    async def detect(self, message: str, history: Sequence[Turn]) -> Detection:
        self.pool.look("detector")
        await asyncio.sleep(0)
        return Detection(needs_context=True, reason="looking")


class LookingRewriter(_Looking):
    async def rewrite(self, message: str, history: Sequence[Turn], *, summary: str | None = None) -> Rewrite:
        self.pool.look("rewriter")
        await asyncio.sleep(0)
        return Rewrite(text=message, changed=False, source="test")


class LookingSummarizer(_Looking):
    async def summarize(self, previous: Summary | None, turns: Sequence[Turn]) -> SummaryResult:
        self.pool.look("summarizer")
        await asyncio.sleep(0)
        return SummaryResult(text=" / ".join(t.content[:20] for t in turns))


class LookingExtractor(_Looking):
    async def extract(self, turn: Turn, current: Sequence[Constraint]) -> ConstraintUpdate:
        self.pool.look("extractor")
        await asyncio.sleep(0)
        if "spicy" in turn.content:
            return ConstraintUpdate(upsert=(Constraint(key="spice", value="no spicy food", source_seq=turn.seq),))
        return ConstraintUpdate()


class LookingEmotion(_Looking):
    """A contextual scorer: with few turns loaded, its job reads the earlier ones first."""

    async def score(self, text: str) -> float:
        self.pool.look("emotion")
        await asyncio.sleep(0)
        return 0.2

    async def score_in_context(self, text: str, prior: Sequence[PriorTurn]) -> float:
        self.pool.look("emotion")
        await asyncio.sleep(0)
        return 0.3


async def test_no_connection_is_held_while_a_model_or_a_model_backed_processor_works(
    store: PostgresStore, tmp_path: Path
) -> None:
    """The answer model, the detector and rewriter while preparing, and the emotion, constraints
    and summary jobs (the summary strategy with a low threshold: summaries are due, and the
    emotion job reads the turns before the one it scores) all work with no pooled connection
    in use; the turns, summary, pins and scores are stored all the same."""
    pool = await counting(store)
    processors = Processors(
        detector=LookingDetector(pool), rewriter=LookingRewriter(pool), summarizer=LookingSummarizer(pool),
        extractor=LookingExtractor(pool), emotion=LookingEmotion(pool),
    )
    engine = build_engine(store=store, model=answering(pool), counter=CharTokenCounter(), processors=processors,
                          settings=EngineSettings(strategy="summary", summary_threshold=2))
    await run_turns(engine, pool, tmp_path, "looked-at")
    who = {name for name, _, _ in pool.seen}
    assert who == {"model", "detector", "rewriter", "summarizer", "extractor", "emotion"}, who
    # The jobs' task holds no connection while they call a processor (another task may: the
    # turn's lock release and trace write can overlap its jobs); the model and the turn's own
    # processors work while nothing else runs, with none in use at all.
    assert not [seen for seen in pool.seen if seen[2]], pool.seen
    assert not [seen for seen in pool.seen if seen[0] in ("model", "detector", "rewriter") and seen[1]], pool.seen
    state = await store.load(SessionKey("local", "looked-at"))
    assert state.summary is not None and state.summary.covers_seq > 0
    assert [c.key for c in state.constraints] == ["spice"]
    version = await store.version(SessionKey("local", "looked-at"))
    assert version.emotions_version > 0
    assert pool.in_use() == 0
