"""What every framework's measurement shares: LoCoMo replayed into the shipped engine, the
questions asked through an adapter, evidence recall scored on what the adapter returned, and
the adapter's own time (its wall time minus the time spent inside `ContextMode`).

Not a framework module (the leading underscore keeps `bench_integrations.py` from loading it).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from contextmode import ContextMode
from contextmode.assembly.render import data_text
from contextmode.evaluation.locomo import (
    CATEGORIES,
    EvalOptions,
    LocomoConversation,
    _cl100k,
    _engine,
    _replay,
    load_locomo,
)
from contextmode.memory.recall import Recaller, RecallSettings
from contextmode.store.memory import MemoryStore

TENANT = "locomo"
LOCOMO_FILE = "locomo/locomo_dev.json"


def conversations(data_dir: Path, limit: int | None) -> list[LocomoConversation]:
    convs = load_locomo(Path(data_dir) / LOCOMO_FILE)
    return convs[:limit] if limit else convs


@dataclass
class Replayed:
    """A conversation recorded the way `evaluate_locomo` records it, behind a `ContextMode`."""

    memory: ContextMode
    session_id: str
    conversation: LocomoConversation
    seq_of: dict[str, int]
    text_of: dict[int, str]


def replay(conv: LocomoConversation, budget: int) -> Replayed:
    """Record ``conv`` through the shipped engine (offline processors, cl100k, memory store)
    exactly as the library's evaluation does, with ``budget`` tokens of input."""
    engine = _engine(MemoryStore(), _cl100k(), EvalOptions(), Recaller(RecallSettings()))
    memory = ContextMode(tenant=TENANT, engine=engine)
    sid = conv.sample_id.replace(" ", "_")
    seq_of = memory.submit(_replay(engine, conv, sid)).result()
    engine.settings = replace(engine.settings, context_window=budget, reply_reserve=0)
    text_of = {seq_of[t.dia_id]: t.text for t in conv.turns}
    return Replayed(memory=memory, session_id=sid, conversation=conv, seq_of=seq_of, text_of=text_of)


class Clock:
    """Time spent inside the `ContextMode` methods an adapter calls (patched on the instance)."""

    def __init__(self, memory: ContextMode, names: tuple[str, ...]) -> None:
        self.inside = 0.0
        for name in names:
            setattr(memory, name, self._timed(getattr(memory, name)))

    def _timed(self, method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return await method(*args, **kwargs)
            finally:
                self.inside += time.perf_counter() - started

        return timed

    @contextmanager
    def adapter_time(self, out: list[float]) -> Iterator[None]:
        """Append the adapter's own milliseconds for the block (wall minus inside)."""
        inside, started = self.inside, time.perf_counter()
        yield
        out.append(((time.perf_counter() - started) - (self.inside - inside)) * 1000)


def evidence_found(evidence: list[int], text_of: dict[int, str], verbatim: list[str], sections: list[str]) -> float:
    """Share of the evidence turns present verbatim: as a message of their own, or inside the
    key-moment or recall section (the library's `_VERBATIM_LAYERS`)."""
    messages = set(verbatim)
    hits = sum(text_of[seq] in messages or any(data_text(text_of[seq]) in s for s in sections) for seq in evidence)
    return hits / len(evidence)


Ask = Callable[[str], Awaitable[tuple[list[str], list[str]]]]
"""An adapter's question: the verbatim message texts and the key-moment/recall section texts."""


def measure_with(data_dir: Path, budget: int, limit: int | None, make_ask: Callable[[Replayed], tuple[Ask, Clock]]) -> dict[str, float]:
    """Evidence recall through an adapter over the questions of categories 1-4, and the
    adapter's own time per question (p50, ms)."""
    found: list[float] = []
    first: list[float] = []
    best: list[float] = []
    for conv in conversations(data_dir, limit):
        replayed = replay(conv, budget)
        ask, clock = make_ask(replayed)
        try:
            asyncio.run(_ask_all(replayed, ask, clock, found, (first, best)))
        finally:
            replayed.memory.close()
    return {
        "recall": round(sum(found) / max(1, len(found)), 4),
        "overhead_ms_p50": round(statistics.median(best), 3) if best else 0.0,
        "overhead_ms_p50_first": round(statistics.median(first), 3) if first else 0.0,
        "questions": float(len(found)),
    }


REPEATS = 3
"""Each question is asked this many times: recall is scored on the first answer; the overhead
is the least of the repeats (``overhead_ms_p50``: the adapter's own cost without the
scheduler's noise on a shared machine) and the first alone (``overhead_ms_p50_first``)."""


async def _ask_all(replayed: Replayed, ask: Ask, clock: Clock, found: list[float],
                   overhead: tuple[list[float], list[float]]) -> None:
    conv = replayed.conversation
    for qa in conv.questions:
        if qa.category not in CATEGORIES:
            continue
        evidence = [replayed.seq_of[e] for e in qa.evidence if e in replayed.seq_of]
        if not evidence:
            continue
        times: list[float] = []
        with clock.adapter_time(times):
            verbatim, sections = await ask(qa.question)
        found.append(evidence_found(evidence, replayed.text_of, verbatim, sections))
        for _ in range(REPEATS - 1):
            with clock.adapter_time(times):
                await ask(qa.question)
        overhead[0].append(times[0])
        overhead[1].append(min(times))
