"""Three service workers on one PostgreSQL or Redis, 30 users × 20 turns spread at random.

Each test starts the stub model server and 3 uvicorn workers (child processes on
loopback ports, `contextmode.testing.worker`), drives 30 concurrent conversations
of 20 turns to random workers, stops the workers gracefully (their background jobs
drain) and then checks the store and the recording summariser's log:

- every session holds exactly its turns, in order (with a kill: every acknowledged
  turn, and extra turns only for requests that were cut off and retried);
- the summaries of a session cover a contiguous chain of ranges, never overlapping,
  and summariser calls = committed summaries (nothing computed twice), apart from the
  one call the killed worker never got to commit;
- no summary is left due, every lock can be taken again, the workers logged no error.

Needs the servers (``CONTEXTMODE_TEST_PG_DSN``, ``CONTEXTMODE_TEST_REDIS_URL``):
skipped when absent, failed under ``CI=true``.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from contextmode.memory.strategies import get_strategy
from contextmode.testing.backends import fresh_store_url
from contextmode.testing.worker import (
    Cluster,
    Conversation,
    WorkerProcess,
    converse,
    message_for,
    read_summary_log,
    turn_index,
)
from contextmode.types import SessionKey

pytestmark = pytest.mark.slow


USERS, TURNS, WORKERS = 30, 20, 3
THRESHOLD = 4
"""Summarise once 4 turns outside the recent window are uncovered: many summaries per session."""
TENANT = "local"
RECENT = get_strategy("sliding_summary").recent_turns
LOCK_TTL_S = 10.0
"""Short enough for the test, longer than a job attempt takes on 3 busy workers on 2 cores:
an attempt cut by its timeout (8 s) after the summariser answered would be redone."""
VICTIM_DELAY_MS = 1000
"""The doomed worker's summaries take this long, so it dies while holding a session lock."""

ENV = {
    "CONTEXTMODE_SUMMARY_THRESHOLD": str(THRESHOLD),
    "CONTEXTMODE_STRATEGY": "sliding_summary",
    "CONTEXTMODE_JOB_BASE_DELAY_S": "0.05",
    "CONTEXTMODE_JOB_TIMEOUT_S": "8",
    "CONTEXTMODE_JOB_LOCK_TTL_S": str(LOCK_TTL_S),
    # A turn lock the killed worker held frees its session within a waiting turn's patience
    # (10 s), as a shorter-lived deployment would configure it.
    "CONTEXTMODE_SESSION_LOCK_TTL_S": "8",
}


# -- backends -------------------------------------------------------------------------


@pytest.fixture(
    params=[pytest.param("postgres", marks=pytest.mark.postgres), pytest.param("redis", marks=pytest.mark.redis)]
)
async def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    async with fresh_store_url(request.param, tmp_path) as url:
        yield url


# -- the run ---------------------------------------------------------------------------


@dataclass
class Run:
    conversations: list[Conversation]
    calls: list[dict[str, Any]]
    cluster: Cluster
    victim: WorkerProcess | None = None
    killed_at: float | None = None
    """Wall-clock time (``time.time()``) of the SIGKILL."""
    busy_at_kill: set[str] = field(default_factory=set)
    """Sessions whose job lock someone held right after the SIGKILL."""


async def _run(store_url: str, tmp_path: Path, *, kill: bool) -> Run:
    import httpx

    summary_log = tmp_path / "summaries.jsonl"
    cluster = Cluster(
        workers=WORKERS,
        store_url=store_url,
        log_dir=tmp_path / "logs",
        env={**ENV, "CONTEXTMODE_WORKER_SUMMARY_LOG": str(summary_log)},
        worker_env={0: {"CONTEXTMODE_WORKER_SUMMARY_DELAY_MS": str(VICTIM_DELAY_MS)}} if kill else {},
    )
    await asyncio.to_thread(cluster.start)
    run = Run(conversations=[], calls=[], cluster=cluster)
    try:
        rng = random.Random(7)
        limits = httpx.Limits(max_connections=USERS * WORKERS, max_keepalive_connections=USERS * WORKERS)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            users = asyncio.gather(
                *(converse(client, cluster.urls, f"conv-{i:02d}", TURNS, rng=rng) for i in range(USERS))
            )
            if kill:
                killer = asyncio.create_task(_kill_mid_summary(cluster.processes[0], store_url, summary_log, run))
                run.conversations = list(await users)
                await killer
            else:
                run.conversations = list(await users)
    finally:
        await asyncio.to_thread(cluster.stop)
    run.calls = read_summary_log(summary_log)
    return run


async def _kill_mid_summary(victim: WorkerProcess, store_url: str, summary_log: Path, run: Run) -> None:
    """SIGKILL ``victim`` right after it starts its 3rd summary (it then holds that session's
    lock for a second), then note which sessions' locks are still held at that moment."""
    from contextmode.errors import LockNotAcquired
    from contextmode.store import open_store

    store = open_store(store_url)
    try:
        await store.version(SessionKey(TENANT, "warm-up"))  # connect before the moment counts
        deadline = time.monotonic() + 120
        while len([c for c in read_summary_log(summary_log) if c["pid"] == victim.pid]) < 3:
            assert time.monotonic() < deadline, "the worker to kill never started a 3rd summary"
            await asyncio.sleep(0.01)
        victim.kill()
        run.victim, run.killed_at = victim, time.time()
        for i in range(USERS):
            try:
                async with store.lock(SessionKey(TENANT, f"conv-{i:02d}"), ttl_s=1):
                    pass
            except LockNotAcquired:
                run.busy_at_kill.add(f"conv-{i:02d}")
    finally:
        await store.close()


# -- checks ------------------------------------------------------------------------------


async def _check_turns(store: Any, conversation: Conversation, *, killed: bool) -> list[Any]:
    sid = conversation.session_id
    assert conversation.http_errors == [], conversation.http_errors
    assert [t.index for t in conversation.turns] == list(range(TURNS)), f"{sid}: not every turn was acknowledged"
    info = await store.info(SessionKey(TENANT, sid))
    assert info is not None
    log = await store.turns(SessionKey(TENANT, sid), from_seq=1, to_seq=info.last_seq)
    assert [t.seq for t in log] == list(range(1, info.last_seq + 1))
    acknowledged: set[int] = set()
    for sent in conversation.turns:  # every acknowledged turn is there, where the client was told
        user = log[sent.user_seq - 1]
        assert user.role == "user" and user.content == message_for(sid, sent.index)
        assert sent.seq is not None
        answer = log[sent.seq - 1]
        assert answer.role == "assistant" and answer.metadata.get("reply_to") == sent.user_seq
        assert not answer.partial
        acknowledged |= {sent.user_seq, sent.seq}
    user_seqs = [sent.user_seq for sent in conversation.turns]
    assert user_seqs == sorted(user_seqs), f"{sid}: turns out of order"
    # No stale state: whichever worker served turn i had loaded every earlier turn, even
    # those other workers stored a moment before (until a summary covers them, all
    # earlier turns are in the recent layer; later, at least the window).
    for sent in conversation.turns:
        earlier = sent.user_seq - 1
        assert sent.recent_items >= min(earlier, RECENT), f"{sid}#{sent.index}: context missed earlier turns"
        if earlier <= RECENT + THRESHOLD - 2:
            assert sent.recent_items == earlier, f"{sid}#{sent.index}: {sent.recent_items} recent, {earlier} stored"
    if not killed:
        assert len(log) == 2 * TURNS
        assert acknowledged == set(range(1, 2 * TURNS + 1))
        return log
    # A request cut off by the kill may have stored its user turn (and even its answer)
    # before the client saw the connection drop: only such retried turns may add turns.
    retried = {sent.index for sent in conversation.turns if sent.retried}
    by_seq = {t.seq: t for t in log}
    for turn in log:
        if turn.seq in acknowledged:
            continue
        source = by_seq[turn.metadata["reply_to"]] if turn.role == "assistant" else turn
        tag = turn_index(source.content)
        assert tag is not None and tag[0] == sid and tag[1] in retried, f"{sid}: stray turn {turn.seq}"
    return log


def _summary_chain(calls: list[dict[str, Any]], covers: int, victim_pid: int | None) -> tuple[list[Any], list[Any]]:
    """The calls whose results were committed (a contiguous chain 1..covers) and the orphans."""
    by_from: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for call in calls:
        by_from[call["from"]].append(call)
    chain: list[dict[str, Any]] = []
    position = 1
    while position <= covers:
        group = by_from.pop(position, [])
        survivors = [c for c in group if c["pid"] != victim_pid]
        assert len(survivors) <= 1, f"range starting at {position} summarised twice: {group}"
        taken = survivors[0] if survivors else None
        if taken is None:
            assert len(group) == 1, f"no single summary starts at {position}: {group}"
            taken = group[0]
        group.remove(taken)
        assert all(c["pid"] == victim_pid for c in group), group
        by_from.setdefault(position, []).extend(group)  # the killed worker's orphan, if any
        chain.append(taken)
        position = taken["to"] + 1
    assert position == covers + 1, f"summaries end at {position - 1}, the store says {covers}"
    orphans = [c for group in by_from.values() for c in group]
    return chain, orphans


async def _check(run: Run, store_url: str, *, killed: bool) -> None:
    from contextmode.store import open_store

    recent = RECENT
    victim_pid = run.victim.pid if run.victim is not None else None
    store = open_store(store_url)
    calls_by_session: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for call in run.calls:
        calls_by_session[call["session"]].append(call)
    assert set(calls_by_session) <= {c.session_id for c in run.conversations}, "summary of an unknown session"
    committed = 0
    orphans: list[dict[str, Any]] = []
    try:
        for conversation in run.conversations:
            sid = conversation.session_id
            await _check_turns(store, conversation, killed=killed)
            info = await store.info(SessionKey(TENANT, sid))
            assert info is not None and info.summary_version >= 1, f"{sid}: never summarised"
            chain, extra = _summary_chain(calls_by_session[sid], info.summary_covers_seq, victim_pid)
            assert len(chain) == info.summary_version, f"{sid}: {len(chain)} calls, {info.summary_version} commits"
            # Nothing left due: the last turn's job (or the next turn's, after a kill) caught up.
            assert info.last_seq - recent - info.summary_covers_seq < THRESHOLD, f"{sid}: a summary is still due"
            summary = (await store.load(SessionKey(TENANT, sid), recent=0, max_uncovered=0)).summary
            assert summary is not None and summary.covers_seq == info.summary_covers_seq
            async with store.lock(SessionKey(TENANT, sid), ttl_s=5):
                pass  # no lock left behind, not even the killed worker's
            committed += info.summary_version
            orphans += extra
    finally:
        await store.close()
    assert len(run.calls) == committed + len(orphans)
    if not killed:
        assert orphans == [], "a summary was computed and thrown away"
    else:
        assert run.killed_at is not None
        # The calls the worker died in (one per session it was summarising) were lost;
        # their sessions' locks outlived the worker, then expired, and another worker
        # redid each range exactly once.
        assert orphans, "the killed worker was not summarising"
        assert all(c["pid"] == victim_pid and c["t"] <= run.killed_at for c in orphans), orphans
        assert len({c["session"] for c in orphans}) == len(orphans), "two orphans in one session"
        for orphan in orphans:
            assert orphan["session"] in run.busy_at_kill, f"{orphan['session']}: the dead worker's lock was not held"
            redo = [c for c in calls_by_session[orphan["session"]] if c["from"] == orphan["from"] and c is not orphan]
            assert len(redo) == 1 and redo[0]["pid"] != victim_pid and redo[0]["t"] > run.killed_at, redo
        assert any(c.transport_errors for c in run.conversations), "no client ever hit the dead worker"
    _check_logs(run.cluster, victim_pid)


_BAD_LOG = re.compile(r"Traceback|\bERROR\b|\bCRITICAL\b")


def _check_logs(cluster: Cluster, victim_pid: int | None) -> None:
    for worker in cluster.processes:
        if worker.pid == victim_pid:
            assert worker.process.returncode == -9
            continue
        text = worker.log()
        assert not _BAD_LOG.search(text), f"worker {worker.pid} logged an error:\n{text[-3000:]}"
        # uvicorn re-raises SIGTERM after its graceful shutdown (-15); 0 is clean too.
        assert worker.process.returncode in (0, -15), f"worker {worker.pid} exited with {worker.process.returncode}"


# -- tests -----------------------------------------------------------------------------------


async def test_three_workers_share_the_store_under_load(store_url: str, tmp_path: Path) -> None:
    run = await _run(store_url, tmp_path, kill=False)
    await _check(run, store_url, killed=False)
    workers_used = {sent.worker for c in run.conversations for sent in c.turns}
    assert len(workers_used) == WORKERS


async def test_a_worker_killed_mid_summary_loses_nothing_acknowledged(store_url: str, tmp_path: Path) -> None:
    run = await _run(store_url, tmp_path, kill=True)
    await _check(run, store_url, killed=True)
