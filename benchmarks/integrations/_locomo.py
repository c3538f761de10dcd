"""LoCoMo evidence recall and per-turn overhead through a framework adapter.

Replays each LoCoMo conversation as `contextmode.evaluation.locomo` does (the shipped
engine, offline processors, cl100k, a memory store, jobs drained after each user turn,
turns dated as in the data), but every turn goes through the adapter's own translation:
the framework message is built (``HumanMessage`` / ``ChatMessage``…), turned into the
stored turn by the adapter (`message_to_record`) and stored by the adapter's session
(`SessionMemory.record`, on the `ContextMode`'s loop thread). Each question of categories
1–4 is then asked at the end as the library asks it (``budget`` input tokens, asked one
hour after the last turn, the question not stored) through the adapter's read path
(`SessionMemory.context_for`, then the adapter's `context_to_messages`); the context it
assembled is scored with the library's own scorer (`locomo._score`).

Measured: ``recall`` (the library's evidence recall, through the adapter),
``library_recall`` (the library's own replay and questions, `locomo._replay` /
`locomo._ask`, on the same questions, for comparison), ``questions``, and ``overhead_ms_p50``: per adapter call (one stored
turn, one assembled context) the time the adapter adds around the `ContextMode` call it
makes (translating, the hop to the `ContextMode`'s loop thread and back), median over
every call; ``store_overhead_ms_p50`` and ``context_overhead_ms_p50`` split it by kind,
and ``translate_ms_p50`` is the adapter's own code alone (framework message to stored
turn, context to framework messages), without the thread hops. The hops are two thread
wake-ups: about 0.1 ms each on an idle machine, several ms when the cores are contended.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from contextmode.api import ContextMode, MessageRecord
from contextmode.assembly import Context
from contextmode.evaluation import locomo
from contextmode.integrations._session import SessionMemory
from contextmode.memory import get_strategy
from contextmode.memory.recall import Recaller, RecallSettings
from contextmode.settings import EngineSettings
from contextmode.store.memory import MemoryStore

__all__ = ["measure_adapter"]

T = TypeVar("T")
Message = TypeVar("Message")


def locomo_file(data_dir: Path) -> Path:
    """``locomo_dev.json`` under ``data_dir`` (the data root, its ``locomo`` folder, or the file)."""
    for candidate in (data_dir, data_dir / "locomo_dev.json", data_dir / "locomo" / "locomo_dev.json"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"no locomo_dev.json under {data_dir}")


class _Clock:
    """Time spent inside the `ContextMode` calls the adapter makes."""

    def __init__(self, memory: ContextMode) -> None:
        self.inner = 0.0
        for name in ("arecord_messages", "acontext"):
            setattr(memory, name, self._timed(getattr(memory, name)))

    def _timed(self, method: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., Coroutine[Any, Any, T]]:
        async def timed(*args: Any, **kwargs: Any) -> T:
            started = time.perf_counter()
            try:
                return await method(*args, **kwargs)
            finally:
                self.inner += time.perf_counter() - started
        return timed


async def _through_adapter(
    conv: locomo.LocomoConversation, budget: int, questions: Sequence[locomo.LocomoQuestion],
    to_message: Callable[[str, str], Message], to_record: Callable[[Message], MessageRecord],
    to_messages: Callable[[Context], Sequence[Message]], cell: dict[str, Any], overhead: dict[str, list[float]],
) -> None:
    engine = locomo._engine(MemoryStore(), locomo._cl100k(), locomo.EvalOptions(), Recaller(RecallSettings()))
    memory = ContextMode(engine=engine)
    session = SessionMemory(locomo._session_id(conv, ""), memory=memory, budget=None, user_id=None)
    clock = _Clock(memory)
    seq_of: dict[str, int] = {}
    try:
        for lt in conv.turns:
            role = "user" if lt.speaker == conv.speaker_a else "assistant"
            message = to_message(role, lt.text)
            before, started = clock.inner, time.perf_counter()
            record = to_record(message)
            overhead["translate"].append((time.perf_counter() - started) * 1000)
            record = replace(record, created_at=lt.at,
                             metadata={**record.metadata, "speaker": lt.speaker, "dia_id": lt.dia_id})
            turn = (await session.call(session.record([record])))[0]
            overhead["store"].append((time.perf_counter() - started - (clock.inner - before)) * 1000)
            seq_of[lt.dia_id] = turn.seq
            if role == "user":
                await session.call(engine.drain())
        await session.call(engine.drain())
        # asked as the library asks: the budget is the whole input, one hour after the last turn
        engine.settings = replace(engine.settings, context_window=budget, reply_reserve=0)
        now = conv.turns[-1].at + timedelta(hours=1)
        text_of = {seq_of[t.dia_id]: t.text for t in conv.turns}
        for qa in questions:
            evidence = [seq_of[e] for e in qa.evidence if e in seq_of]
            if not evidence:
                continue
            sentences = [locomo._sentences(text_of[seq]) for seq in evidence]
            before, started = clock.inner, time.perf_counter()
            context = await session.call(session.context_for(qa.question, None, now=now))
            translating = time.perf_counter()
            messages = to_messages(context)
            overhead["translate"].append((time.perf_counter() - translating) * 1000)
            overhead["context"].append((time.perf_counter() - started - (clock.inner - before)) * 1000)
            if not messages:
                raise AssertionError("the adapter gave the model nothing")
            locomo._score(cell, context, qa, evidence, sentences)
    finally:
        memory.close()


async def _library(
    conv: locomo.LocomoConversation, budget: int, questions: Sequence[locomo.LocomoQuestion],
    cells: dict[tuple[str, int], dict[str, Any]],
) -> None:
    """The library's own figure on the same questions (`locomo._replay`, `locomo._ask`)."""
    engine = locomo._engine(MemoryStore(), locomo._cl100k(), locomo.EvalOptions(), Recaller(RecallSettings()))
    sid = locomo._session_id(conv, "")
    try:
        seq_of = await locomo._replay(engine, conv, sid)
        strategy = get_strategy(EngineSettings().strategy)
        await locomo._ask(engine, replace(conv, questions=tuple(questions)), sid, seq_of, [strategy], [budget],
                          cells, None)
    finally:
        await engine.close()


def _p50(values: Sequence[float]) -> float:
    return round(statistics.median(values), 4) if values else 0.0


def measure_adapter(
    data_dir: Path, budget: int, limit: int | None, *,
    to_message: Callable[[str, str], Message], to_record: Callable[[Message], MessageRecord],
    to_messages: Callable[[Context], Sequence[Message]], compare: bool = True,
) -> dict[str, float]:
    """Evidence recall at ``budget`` through an adapter (module docstring) on the first
    ``limit`` questions of categories 1–4 (all when ``None``), in file order; with
    ``compare``, also ``library_recall`` on the same questions (a second replay)."""
    conversations = locomo.load_locomo(locomo_file(data_dir))
    cell = locomo._new_cell()
    library = {(get_strategy(EngineSettings().strategy).name, budget): locomo._new_cell()}
    overhead: dict[str, list[float]] = {"store": [], "context": [], "translate": []}
    left = limit
    for conv in conversations:
        asked = [q for q in conv.questions if q.category in locomo.CATEGORIES]
        if left is not None:
            asked, left = asked[:left], left - len(asked[:left])
        if not asked:
            break
        asyncio.run(_through_adapter(conv, budget, asked, to_message, to_record, to_messages, cell, overhead))
        if compare:
            asyncio.run(_library(conv, budget, asked, library))
    lib = next(iter(library.values()))
    out = {
        "recall": round(cell["found"] / max(1, cell["n"]), 4),
        "questions": float(cell["n"]),
        "overhead_ms_p50": _p50(overhead["store"] + overhead["context"]),
        "store_overhead_ms_p50": _p50(overhead["store"]),
        "context_overhead_ms_p50": _p50(overhead["context"]),
        "translate_ms_p50": _p50(overhead["translate"]),
    }
    if compare:
        out["library_recall"] = round(lib["found"] / max(1, lib["n"]), 4)
    return out
