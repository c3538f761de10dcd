"""The store contract: one pytest suite every `Store` backend must pass.

Run it against your own store by subclassing `StoreContract` and providing a
``store`` fixture that yields a fresh store no other test writes to::

    import pytest
    from contextmode.testing.contract import StoreContract

    class TestMyStore(StoreContract):
        @pytest.fixture
        async def store(self):
            store = MyStore(...)
            yield store
            await store.close()

It needs pytest and pytest-asyncio (``asyncio_mode = "auto"``, or mark the
fixture with ``pytest_asyncio.fixture`` in strict mode). A new backend's store is
``StoreFront(YourDriver(...))``; `store.minimal.MinimalDriver` is the template driver.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from ..errors import ConflictError, InvalidSessionId, LockNotAcquired
from ..store.base import (
    IdempotencyRecord,
    IdempotencyRecords,
    SessionVersion,
    SharesConnection,
    Store,
    TraceRecords,
    TurnLocks,
    keeps_traces,
)
from ..store.postings import IndexStats, has_postings, postings_for, reads_turns_at, unpack
from ..store.records import TraceLayer, TurnTrace
from ..text.index_terms import analyze
from ..types import ChatMessage, Constraint, NewTurn, SessionKey, Summary, ToolCall, tool_metadata
from .ci import skip_or_fail

__all__ = [
    "StoreContract",
    "check_appends_after_another_worker_index_right",
    "check_concurrent_writers",
    "new_turns",
    "service_url",
    "skip_or_fail",
    "unique_id",
]


def unique_id(prefix: str = "s") -> str:
    """A session or tenant id no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def new_turns(count: int, *, start: int = 1, prefix: str = "turn") -> list[NewTurn]:
    """``count`` alternating user/assistant turns whose content names their number."""
    return [
        NewTurn(
            role="user" if (start + i) % 2 else "assistant",
            content=f"{prefix} {start + i} 你好",
            tokens=3,
        )
        for i in range(count)
    ]


def service_url(env: str, default: str) -> str:
    """The URL of a test service from ``env`` (or ``default``) — for skip/fail decisions.

    Callers check reachability themselves and call `skip_or_fail` when it is absent.
    """
    return os.environ.get(env) or default


_T, _S = "tenant-a", "session-1"


class StoreContract:
    """Behaviour every backend guarantees. Subclasses provide the ``store`` fixture."""

    pytestmark = pytest.mark.asyncio

    # -- optional: turn locks and idempotency records (every shipped backend) -------

    async def test_turn_lock_is_single_flight_and_apart_from_the_job_lock(self, store: Store) -> None:
        if not isinstance(store, TurnLocks):
            return  # an optional protocol: the service falls back to a per-process queue
        async with store.turn_lock(SessionKey(_T, _S), ttl_s=30):
            with pytest.raises(LockNotAcquired):
                async with store.turn_lock(SessionKey(_T, _S)):
                    pass
            async with store.lock(SessionKey(_T, _S)):  # background jobs are not blocked by a turn
                pass
            async with store.turn_lock(SessionKey(_T, "another-session")):
                pass
        async with store.turn_lock(SessionKey(_T, _S)):  # released
            pass

    async def test_calls_in_a_shared_connection_scope_behave_as_alone(self, store: Store) -> None:
        """`SharesConnection` (optional; every shipped backend): inside `one_connection`, with a
        `let_go` half-way, a nested scope and a failed call in between, every call does what it
        does alone, and the scope ends cleanly."""
        if not isinstance(store, SharesConnection):
            return
        async with store.one_connection():
            await store.let_go()  # nothing held yet: nothing to do
            async with store.turn_lock(SessionKey(_T, _S)) if isinstance(store, TurnLocks) else store.lock(SessionKey(_T, _S)):
                first = await store.append(SessionKey(_T, _S), new_turns(2))
                await store.let_go()
                async with store.one_connection():  # the same scope
                    assert (await store.load(SessionKey(_T, _S))).last_seq == 2
                with pytest.raises(ConflictError):
                    await store.append(SessionKey(_T, _S), new_turns(1), expected_last_seq=0)
                second = await store.append(SessionKey(_T, _S), new_turns(1, start=3))
            await store.let_go()
            await store.let_go()
        assert [t.seq for t in first + second] == [1, 2, 3]
        assert [t.seq for t in await store.turns(SessionKey(_T, _S))] == [1, 2, 3]
        async with store.lock(SessionKey(_T, _S)):  # the lock taken inside the scope was released
            pass

    async def test_idempotency_records_claim_finish_release(self, store: Store) -> None:
        if not isinstance(store, IdempotencyRecords):
            return  # an optional protocol: the service then ignores Idempotency-Key
        assert await store.claim_idempotency(_T, "k1", "first", session_id=_S, lease_s=60) is None
        running = IdempotencyRecord(fingerprint="first", status=0, response="")
        assert await store.claim_idempotency(_T, "k1", "second", session_id=_S, lease_s=60) == running
        # Keys are per tenant, not per session: another session sees the same record.
        assert await store.claim_idempotency(_T, "k1", "second", session_id="session-2", lease_s=60) == running
        assert await store.claim_idempotency("tenant-b", "k1", "other", session_id=_S, lease_s=60) is None  # per tenant
        await store.finish_idempotency(_T, "k1", status=200, response='{"answer": "好"}', ttl_s=60)
        done = IdempotencyRecord(fingerprint="first", status=200, response='{"answer": "好"}')
        assert await store.claim_idempotency(_T, "k1", "first", session_id=_S, lease_s=60) == done
        await store.release_idempotency(_T, "k1")
        assert await store.claim_idempotency(_T, "k1", "third", session_id=_S, lease_s=60) is None
        # A running record whose worker died lapses with its lease.
        assert await store.claim_idempotency(_T, "k2", "first", session_id=_S, lease_s=0.05) is None
        await asyncio.sleep(0.3)
        assert await store.claim_idempotency(_T, "k2", "retry", session_id=_S, lease_s=60) is None

    # -- optional: the recall index kept beside the log (store.postings) -------------

    async def test_recall_index_is_written_with_the_turns_and_erased_with_them(
        self, store: Store
    ) -> None:
        log = store
        if not has_postings(store):
            return  # an optional protocol: recall then indexes the turns in its process

        async def writer(name: str) -> None:  # racing appends: each one's postings stay whole
            for i in range(12):
                await log.append(SessionKey(_T, _S), [
                    NewTurn(role="user", content=f"{name} coffee 咖啡 number {i}", tokens=3),
                    NewTurn(role="assistant", content=f"garden {name} {i}", tokens=3,
                            metadata={"speaker": "Bob"}),
                ])

        await asyncio.gather(*(writer(name) for name in ("ann", "cai", "dee")))
        await log.append(SessionKey(_T, _S), [NewTurn(role="system", content="coffee rules", tokens=2)])
        turns = await log.turns(SessionKey(_T, _S))
        expected = postings_for(turns, None)  # the whole log indexed in one pass
        stats = await store.index_stats(SessionKey(_T, _S))
        assert (stats.exists, stats.indexed_seq, stats.docs) == (True, 73, 72)  # no system turn
        assert stats.total_len == pytest.approx(expected.length, rel=1e-12)
        want: dict[str, list[tuple[int, bytes]]] = {}
        for term, block, data in expected.rows:
            want.setdefault(term, []).append((block, data))
        stored = await store.postings(SessionKey(_T, _S), sorted(want))
        assert {t: unpack(rows).tolist() for t, rows in stored.items()} == {
            t: unpack(sorted(rows)).tolist() for t, rows in want.items()
        }
        coffee, bob, garden = (analyze(word)[0] for word in ("coffee", "Bob", "garden"))
        counts = await store.term_counts(SessionKey(_T, _S), [coffee, bob, "nowhere"])
        assert counts == {t: len(unpack(want[t])) for t in (coffee, bob)}
        assert counts[coffee] == 72  # 36 questions, and the 36 answers after them (expansion)
        # One read for a query: plain terms always, capped ones only within the cap.
        rows, capped = await store.query_postings(
            SessionKey(_T, _S), {garden: 0}, capped={coffee: 0, bob: 0, "nowhere": 0}, cap=counts[bob], most=1
        )
        assert capped == counts and set(rows) == {garden, bob}
        unread, capped = await store.query_postings(
            SessionKey(_T, _S), {}, capped={"nowhere": 0, bob: 0}, cap=72, most=1
        )
        assert capped == {bob: counts[bob]} and unread == {}  # "nowhere" (in no turn) took the place
        assert {t: unpack(r).tolist() for t, r in rows.items()} == {
            t: unpack(sorted(want[t])).tolist() for t in (garden, bob)
        }
        assert not (await store.index_stats(SessionKey("tenant-b", _S))).exists
        assert await store.postings(SessionKey("tenant-b", _S), [coffee]) == {}
        assert await log.delete(SessionKey(_T, _S))
        assert await store.index_stats(SessionKey(_T, _S)) == IndexStats()
        assert await store.postings(SessionKey(_T, _S), [coffee, garden]) == {}
        assert await store.term_counts(SessionKey(_T, _S), [coffee]) == {}

    # -- the append-only log ------------------------------------------------------

    async def test_append_numbers_turns_from_one_and_round_trips(self, store: Store) -> None:
        at = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
        turn = NewTurn(role="user", content="不要辣, please", tokens=5, created_at=at,
                       emotion=0.25, metadata={"image_count": 2, "tags": ["a", "中"]})
        stored = await store.append(SessionKey(_T, _S), [turn, *new_turns(2, start=2)])
        assert [t.seq for t in stored] == [1, 2, 3]
        read = await store.turns(SessionKey(_T, _S))
        assert read == stored
        first = read[0]
        assert (first.role, first.content, first.tokens) == ("user", "不要辣, please", 5)
        assert first.created_at == at
        assert first.emotion == 0.25
        assert dict(first.metadata) == {"image_count": 2, "tags": ["a", "中"]}

    async def test_compare_and_set_append(self, store: Store) -> None:
        await store.append(SessionKey(_T, _S), new_turns(2), expected_last_seq=0)
        with pytest.raises(ConflictError):
            await store.append(SessionKey(_T, _S), new_turns(2, start=3), expected_last_seq=1)
        with pytest.raises(ConflictError):
            await store.append(SessionKey(_T, "fresh"), new_turns(1), expected_last_seq=3)
        assert (await store.version(SessionKey(_T, _S))).last_seq == 2
        assert await store.info(SessionKey(_T, "fresh")) is None
        stored = await store.append(SessionKey(_T, _S), new_turns(3, start=3), expected_last_seq=2)
        assert [t.seq for t in stored] == [3, 4, 5]

    async def test_empty_append_writes_nothing(self, store: Store) -> None:
        assert await store.append(SessionKey(_T, _S), []) == []
        assert await store.info(SessionKey(_T, _S)) is None
        with pytest.raises(ConflictError):
            await store.append(SessionKey(_T, _S), [], expected_last_seq=4)

    async def test_concurrent_appends_never_interleave_or_lose(self, store: Store) -> None:
        async def writer(name: str) -> None:
            for i in range(5):
                await store.append(SessionKey(_T, _S), new_turns(2, prefix=f"{name}-{i}"))

        await asyncio.gather(*(writer(f"w{k}") for k in range(4)))
        turns = await store.turns(SessionKey(_T, _S))
        assert [t.seq for t in turns] == list(range(1, 41))
        for pair in zip(turns[::2], turns[1::2], strict=True):
            # A two-turn append is atomic: both halves sit next to each other.
            assert pair[0].content.split()[0] == pair[1].content.split()[0]

    async def test_last_answer_is_the_newest_assistant_turn(self, store: Store) -> None:
        await store.append(SessionKey(_T, _S), [NewTurn(role="user", content="q", tokens=1)])
        assert (await store.load(SessionKey(_T, _S))).last_answer is None
        await store.append(SessionKey(_T, _S), [
            NewTurn(role="assistant", content="答案一", tokens=3),
            NewTurn(role="user", content="再来", tokens=2),
        ])
        broken = NewTurn(role="assistant", content="半截", tokens=2, metadata={"partial": True})
        await store.append(SessionKey(_T, _S), [broken])
        state = await store.load(SessionKey(_T, _S))
        assert state.last_answer == "半截"
        assert state.turns[-1].partial

    async def test_tenants_are_isolated(self, store: Store) -> None:
        await store.append(SessionKey("t1", _S), new_turns(3))
        await store.append(SessionKey("t2", _S), new_turns(1))
        assert (await store.load(SessionKey("t1", _S))).last_seq == 3
        assert (await store.load(SessionKey("t2", _S))).last_seq == 1
        assert [i.session_id for i in await store.list_sessions("t2")] == [_S]
        assert await store.delete(SessionKey("t2", _S))
        assert (await store.load(SessionKey("t1", _S))).last_seq == 3

    async def test_invalid_ids_never_reach_the_backend(self, store: Store) -> None:
        # A session call takes a SessionKey, which cannot hold an invalid id; the tenant-wide
        # calls and user ids are checked by the store itself.
        for tenant, session in [("ok", "bad/id"), ("bad id", "ok"), ("ok", ""), ("ok", "..")]:
            with pytest.raises(InvalidSessionId):
                SessionKey(tenant, session)
        for bad in ("bad id", "", "..", "a/b"):
            with pytest.raises(InvalidSessionId):
                await store.list_sessions(bad)
            with pytest.raises(InvalidSessionId):
                await store.list_sessions(_T, user_id=bad)
            with pytest.raises(InvalidSessionId):
                await store.append(SessionKey(_T, _S), new_turns(1), user_id=bad)
        assert await store.list_sessions(_T) == []  # nothing was written

    # -- loading ------------------------------------------------------------------

    async def test_load_unknown_session_is_empty(self, store: Store) -> None:
        state = await store.load(SessionKey(_T, "nobody"))
        assert (state.last_seq, tuple(state.turns), state.summary) == (0, (), None)
        assert await store.version(SessionKey(_T, "nobody")) == SessionVersion()
        assert await store.turns(SessionKey(_T, "nobody")) == []

    async def test_load_returns_uncovered_tail_within_bounds(self, store: Store) -> None:
        await store.append(SessionKey(_T, _S), new_turns(30))
        state = await store.load(SessionKey(_T, _S), recent=8, max_uncovered=200)
        assert [t.seq for t in state.turns] == list(range(1, 31))
        state = await store.load(SessionKey(_T, _S), recent=8, max_uncovered=10)
        assert [t.seq for t in state.turns] == list(range(21, 31))
        summary = Summary(text="前情", covers_seq=25, tokens=2)
        assert await store.commit_summary(SessionKey(_T, _S), summary, expected_version=0)
        state = await store.load(SessionKey(_T, _S), recent=8)
        assert [t.seq for t in state.turns] == list(range(23, 31))
        assert state.summary is not None and state.summary.covers_seq == 25
        assert state.summary_covers_seq == 25
        state = await store.load(SessionKey(_T, _S), recent=2)
        assert [t.seq for t in state.turns] == list(range(26, 31))

    async def test_key_moments_come_from_before_the_tail_strongest_first(self, store: Store) -> None:
        await store.append(SessionKey(_T, _S), new_turns(40))
        await store.set_emotions(SessionKey(_T, _S), {3: 0.9, 5: 0.75, 7: 0.95, 9: 0.5, 11: 0.8, 38: 0.99})
        state = await store.load(SessionKey(_T, _S), recent=4, max_uncovered=4, key_moments=3)
        assert [t.seq for t in state.turns] == [37, 38, 39, 40]
        assert [t.seq for t in state.key_moments] == [3, 7, 11]
        assert [t.emotion for t in state.key_moments] == [0.9, 0.95, 0.8]
        assert state.turns[1].emotion == 0.99
        state = await store.load(SessionKey(_T, _S), recent=4, max_uncovered=4, key_moments=10,
                                 key_moment_threshold=0.7)
        assert [t.seq for t in state.key_moments] == [3, 5, 7, 11]
        state = await store.load(SessionKey(_T, _S), recent=4, max_uncovered=4)
        assert tuple(state.key_moments) == ()

    async def test_turns_range(self, store: Store) -> None:
        await store.append(SessionKey(_T, _S), new_turns(10))
        assert [t.seq for t in await store.turns(SessionKey(_T, _S), from_seq=4, to_seq=6)] == [4, 5, 6]
        assert [t.seq for t in await store.turns(SessionKey(_T, _S), from_seq=9)] == [9, 10]
        assert await store.turns(SessionKey(_T, _S), from_seq=11) == []

    async def test_turns_at_scattered_seqs(self, store: Store) -> None:
        reader: object = store
        if not reads_turns_at(reader):
            pytest.skip("this store reads turns by range only")
        await store.append(SessionKey(_T, _S), new_turns(10))
        await store.set_emotions(SessionKey(_T, _S), {7: 0.75})
        got = await reader.turns_at(SessionKey(_T, _S), [9, 2, 7, 2, 0, 11, 40])
        assert [t.seq for t in got] == [2, 7, 9]
        assert got == [t for t in await store.turns(SessionKey(_T, _S)) if t.seq in {2, 7, 9}]
        assert got[1].emotion == 0.75
        assert await reader.turns_at(SessionKey(_T, _S), []) == []
        assert await reader.turns_at(SessionKey(_T, "nobody"), [1]) == []

    async def test_agent_items_round_trip_append_only(self, store: Store) -> None:
        calls = (ToolCall(id="call_1", name="search", arguments='{"q": "里斯本"}'), ToolCall(id="call_2", name="read_file"))
        await store.append(SessionKey(_T, _S), [
            NewTurn(role="user", content="find flights", tokens=2),
            NewTurn(role="assistant", content="", tokens=30, metadata=tool_metadata(tool_calls=calls)),
            NewTurn(role="tool", content='{"price": 120}', tokens=5,
                    metadata=tool_metadata(tool_call_id="call_1", tool_name="search")),
            NewTurn(role="tool", content="x" * 5000, tokens=1000, metadata=tool_metadata(tool_call_id="call_2")),
        ])
        for turns in ((await store.load(SessionKey(_T, _S), recent=8)).turns, await store.turns(SessionKey(_T, _S))):
            assert [t.role for t in turns] == ["user", "assistant", "tool", "tool"]
            assert turns[1].tool_calls == calls and turns[1].tokens == 30
            assert (turns[2].tool_call_id, turns[2].tool_name, turns[2].content) == ("call_1", "search", '{"price": 120}')
            assert turns[3].tool_call_id == "call_2" and len(turns[3].content) == 5000
            assert turns[0].tool_calls == () and turns[0].tool_call_id is None

    # -- derived records ----------------------------------------------------------

    async def test_summary_compare_and_set(self, store: Store) -> None:
        assert not await store.commit_summary(
            SessionKey(_T, _S), Summary(text="x", covers_seq=1, tokens=1), expected_version=0
        )
        await store.append(SessionKey(_T, _S), new_turns(10))
        first = Summary(text="一", covers_seq=4, tokens=1)
        assert await store.commit_summary(SessionKey(_T, _S), first, expected_version=0)
        assert not await store.commit_summary(SessionKey(_T, _S), first, expected_version=0)
        behind = Summary(text="旧", covers_seq=3, tokens=1)
        assert not await store.commit_summary(SessionKey(_T, _S), behind, expected_version=1)
        beyond = Summary(text="未来", covers_seq=11, tokens=1)
        assert not await store.commit_summary(SessionKey(_T, _S), beyond, expected_version=1)
        second = Summary(text="二", covers_seq=8, tokens=1)
        assert await store.commit_summary(SessionKey(_T, _S), second, expected_version=1)
        state = await store.load(SessionKey(_T, _S))
        assert state.summary is not None
        assert (state.summary.text, state.summary.version, state.summary.covers_seq) == ("二", 2, 8)
        # Compaction never deletes or rewrites turns.
        assert [t.seq for t in await store.turns(SessionKey(_T, _S))] == list(range(1, 11))

    async def test_summary_from_an_older_state_is_rejected(self, store: Store) -> None:
        await store.append(SessionKey(_T, _S), new_turns(6))
        seen = (await store.load(SessionKey(_T, _S))).summary
        slow = Summary(text="slow, from seq 4", covers_seq=4, tokens=1)
        await store.append(SessionKey(_T, _S), new_turns(4, start=7))
        fast = Summary(text="fast, from seq 10", covers_seq=10, tokens=1)
        assert await store.commit_summary(SessionKey(_T, _S), fast, expected_version=0)
        assert seen is None
        assert not await store.commit_summary(SessionKey(_T, _S), slow, expected_version=0)
        state = await store.load(SessionKey(_T, _S))
        assert state.summary is not None and state.summary.text == "fast, from seq 10"

    async def test_constraints_compare_and_set(self, store: Store) -> None:
        await store.append(SessionKey(_T, _S), new_turns(2))
        pins = [Constraint(key="spice", value="不要辣", source_seq=1, quote="我不吃辣"),
                Constraint(key="budget", value="预算50元以内", kind="preference")]
        assert await store.commit_constraints(SessionKey(_T, _S), pins, expected_version=0)
        assert not await store.commit_constraints(SessionKey(_T, _S), [], expected_version=0)
        state = await store.load(SessionKey(_T, _S))
        assert tuple(state.constraints) == tuple(pins)
        assert state.constraints_version == 1
        assert await store.commit_constraints(SessionKey(_T, _S), pins[:1], expected_version=1)
        assert tuple((await store.load(SessionKey(_T, _S))).constraints) == tuple(pins[:1])
        assert not await store.commit_constraints(SessionKey(_T, "nobody"), pins, expected_version=0)

    async def test_set_emotions_is_idempotent_and_ignores_unknown_turns(self, store: Store) -> None:
        await store.set_emotions(SessionKey(_T, "nobody"), {1: 0.9})
        assert await store.info(SessionKey(_T, "nobody")) is None
        await store.append(SessionKey(_T, _S), new_turns(3))
        await store.set_emotions(SessionKey(_T, _S), {2: 0.8, 9: 0.9, 0: 0.9})
        after_first = await store.version(SessionKey(_T, _S))
        await store.set_emotions(SessionKey(_T, _S), {2: 0.8})
        assert await store.version(SessionKey(_T, _S)) == after_first
        assert [t.emotion for t in await store.turns(SessionKey(_T, _S))] == [None, 0.8, None]
        await store.set_emotions(SessionKey(_T, _S), {2: 0.4})
        assert (await store.turns(SessionKey(_T, _S), from_seq=2, to_seq=2))[0].emotion == 0.4

    async def test_version_moves_with_every_change(self, store: Store) -> None:
        await store.append(SessionKey(_T, _S), new_turns(4))
        seen = [await store.version(SessionKey(_T, _S))]
        await store.append(SessionKey(_T, _S), new_turns(1, start=5))
        seen.append(await store.version(SessionKey(_T, _S)))
        await store.commit_summary(SessionKey(_T, _S), Summary(text="s", covers_seq=2, tokens=1),
                                   expected_version=0)
        seen.append(await store.version(SessionKey(_T, _S)))
        await store.commit_constraints(SessionKey(_T, _S), [Constraint(key="k", value="v")],
                                       expected_version=0)
        seen.append(await store.version(SessionKey(_T, _S)))
        await store.set_emotions(SessionKey(_T, _S), {1: 0.9})
        seen.append(await store.version(SessionKey(_T, _S)))
        assert len(set(seen)) == 5
        info = await store.info(SessionKey(_T, _S))
        assert info is not None
        assert seen[-1] == SessionVersion(last_seq=5, summary_version=1, constraints_version=1,
                                          emotions_version=1, created_at=info.created_at)

    async def test_version_tells_a_recreated_session_apart(self, store: Store) -> None:
        await store.append(SessionKey(_T, _S), new_turns(2))
        before = await store.version(SessionKey(_T, _S))
        await store.delete(SessionKey(_T, _S))
        await asyncio.sleep(0.002)
        await store.append(SessionKey(_T, _S), new_turns(2))
        after = await store.version(SessionKey(_T, _S))
        assert after.last_seq == before.last_seq == 2
        assert after != before

    async def test_record_job_shows_in_info(self, store: Store) -> None:
        await store.append(SessionKey(_T, _S), new_turns(1))
        await store.record_job(SessionKey(_T, _S), "summary", ok=False, error="boom")
        await store.record_job(SessionKey(_T, _S), "summary", ok=False, error="boom again")
        info = await store.info(SessionKey(_T, _S))
        assert info is not None
        stats = info.jobs["summary"]
        assert (stats.ok, stats.failed, stats.last_error) == (0, 2, "boom again")
        assert stats.last_run is not None
        await store.record_job(SessionKey(_T, _S), "summary", ok=True)
        info = await store.info(SessionKey(_T, _S))
        assert info is not None
        assert (info.jobs["summary"].ok, info.jobs["summary"].last_error) == (1, None)
        await store.record_job(SessionKey(_T, "nobody"), "summary", ok=True)
        assert await store.info(SessionKey(_T, "nobody")) is None

    async def test_a_rejected_job_is_counted_apart_with_its_reason(self, store: Store) -> None:
        await store.append(SessionKey(_T, _S), new_turns(1))
        await store.record_job(SessionKey(_T, _S), "constraints", ok=True)
        await store.record_job(SessionKey(_T, _S), "constraints", ok=False, error="empty quote", rejected=True)
        await store.record_job(SessionKey(_T, _S), "constraints", ok=False, error="timeout")
        info = await store.info(SessionKey(_T, _S))
        assert info is not None
        stats = info.jobs["constraints"]
        assert (stats.ok, stats.rejected, stats.failed, stats.last_error) == (1, 1, 1, "timeout")
        await store.record_job(SessionKey(_T, _S), "constraints", ok=False, error="example values", rejected=True)
        info = await store.info(SessionKey(_T, _S))
        assert info is not None
        assert (info.jobs["constraints"].rejected, info.jobs["constraints"].last_error) == (2, "example values")

    # -- administration -----------------------------------------------------------

    async def test_info_and_listing(self, store: Store) -> None:
        assert await store.info(SessionKey(_T, _S)) is None
        for sid in ("a", "b", "c"):
            await store.append(SessionKey(_T, sid), new_turns(2))
        await store.append(SessionKey(_T, "a"), new_turns(1, start=3))
        await store.commit_summary(SessionKey(_T, "a"), Summary(text="s", covers_seq=2, tokens=1),
                                   expected_version=0)
        listed = await store.list_sessions(_T)
        assert [i.session_id for i in listed] == ["a", "c", "b"]
        assert [i.session_id for i in await store.list_sessions(_T, limit=1, offset=1)] == ["c"]
        info = await store.info(SessionKey(_T, "a"))
        assert info is not None
        assert (info.tenant, info.last_seq, info.summary_covers_seq, info.summary_version) == (
            _T, 3, 2, 1)
        assert info.created_at <= info.updated_at
        assert await store.list_sessions("other-tenant") == []

    async def test_delete_removes_everything(self, store: Store) -> None:
        assert not await store.delete(SessionKey(_T, _S))
        await store.append(SessionKey(_T, _S), new_turns(5))
        await store.set_emotions(SessionKey(_T, _S), {1: 0.9})
        await store.commit_summary(SessionKey(_T, _S), Summary(text="s", covers_seq=2, tokens=1),
                                   expected_version=0)
        await store.record_job(SessionKey(_T, _S), "summary", ok=True)
        assert await store.delete(SessionKey(_T, _S))
        assert await store.info(SessionKey(_T, _S)) is None
        assert await store.version(SessionKey(_T, _S)) == SessionVersion()
        assert await store.turns(SessionKey(_T, _S)) == []
        stored = await store.append(SessionKey(_T, _S), new_turns(1))
        assert stored[0].seq == 1
        state = await store.load(SessionKey(_T, _S), key_moments=5, key_moment_threshold=0.1)
        assert (state.summary, tuple(state.key_moments)) == (None, ())
        info = await store.info(SessionKey(_T, _S))
        assert info is not None and dict(info.jobs) == {}

    async def test_purge_idle(self, store: Store) -> None:
        await store.append(SessionKey(_T, "old"), new_turns(2))
        await store.append(SessionKey("t2", "old"), new_turns(2))
        await asyncio.sleep(0.01)
        cutoff = datetime.now(UTC)
        await asyncio.sleep(0.01)
        await store.append(SessionKey(_T, "new"), new_turns(2))
        assert await store.purge_idle(cutoff) == 2
        assert [i.session_id for i in await store.list_sessions(_T)] == ["new"]
        assert await store.turns(SessionKey(_T, "old")) == []
        assert await store.purge_idle(cutoff - timedelta(days=1)) == 0

    # -- kept traces --------------------------------------------------------------

    async def test_traces_round_trip_replace_and_stay_in_their_tenant(self, store: Store) -> None:
        traces = _traces(store)
        trace = _trace(1)
        await traces.put_trace(SessionKey(_T, _S), trace)  # unknown session: ignored, nothing created
        assert await store.info(SessionKey(_T, _S)) is None
        await store.append(SessionKey(_T, _S), new_turns(2))
        await traces.put_trace(SessionKey(_T, _S), trace)
        assert await traces.get_trace(SessionKey(_T, _S), 1) == trace
        assert await traces.get_trace(SessionKey("t2", _S), 1) is None
        assert await traces.get_trace(SessionKey(_T, _S), 2) is None
        again = _trace(1, typed="又一次")
        await traces.put_trace(SessionKey(_T, _S), again)
        assert await traces.get_trace(SessionKey(_T, _S), 1) == again

    async def test_traces_are_pruned_by_count_and_age_and_deleted_with_the_session(
        self, store: Store
    ) -> None:
        traces = _traces(store)
        await store.append(SessionKey(_T, _S), new_turns(10))
        old = datetime(2020, 1, 1, tzinfo=UTC)
        await traces.put_trace(SessionKey(_T, _S), _trace(1, created_at=old))
        for turn in range(2, 6):
            await traces.put_trace(SessionKey(_T, _S), _trace(turn), keep=3)
        assert [await traces.get_trace(SessionKey(_T, _S), n) is not None for n in range(1, 6)] == [
            False, False, True, True, True
        ]
        await traces.put_trace(SessionKey(_T, _S), _trace(6, created_at=old))
        await traces.put_trace(SessionKey(_T, _S), _trace(7), older_than=datetime(2021, 1, 1, tzinfo=UTC))
        assert await traces.get_trace(SessionKey(_T, _S), 6) is None
        assert await traces.delete_traces(SessionKey(_T, _S)) == 4
        assert await traces.get_trace(SessionKey(_T, _S), 7) is None
        assert len(await store.turns(SessionKey(_T, _S))) == 10  # the turns stay
        await traces.put_trace(SessionKey(_T, _S), _trace(8))
        assert await store.delete(SessionKey(_T, _S))
        await store.append(SessionKey(_T, _S), new_turns(1))
        assert await traces.get_trace(SessionKey(_T, _S), 8) is None

    # -- job locks ----------------------------------------------------------------

    async def test_lock_is_single_flight_with_growing_tokens(self, store: Store) -> None:
        async with store.lock(SessionKey(_T, _S)) as first:
            with pytest.raises(LockNotAcquired):
                async with store.lock(SessionKey(_T, _S)):
                    pass
            async with store.lock(SessionKey(_T, "other")) as other:
                assert other.token != first.token
        async with store.lock(SessionKey(_T, _S)) as again:
            assert again.token > first.token

    async def test_expired_lock_is_taken_over_and_not_released_by_the_old_holder(
        self, store: Store
    ) -> None:
        stale = store.lock(SessionKey(_T, _S), ttl_s=0.05)
        old = await stale.__aenter__()
        await asyncio.sleep(0.2)
        async with store.lock(SessionKey(_T, _S), ttl_s=30) as new:
            assert new.token > old.token
            await stale.__aexit__(None, None, None)
            with pytest.raises(LockNotAcquired):
                async with store.lock(SessionKey(_T, _S)):
                    pass

    async def test_lock_is_released_when_the_body_fails(self, store: Store) -> None:
        with pytest.raises(RuntimeError):
            async with store.lock(SessionKey(_T, _S)):
                raise RuntimeError("job failed")
        async with store.lock(SessionKey(_T, _S)):
            pass


def _traces(store: Store) -> TraceRecords:
    assert keeps_traces(store), "every shipped backend keeps per-turn traces"
    return store


def _trace(turn: int, *, typed: str = "那家店在哪？", created_at: datetime | None = None) -> TurnTrace:
    return TurnTrace(
        turn=turn,
        user_seq=2 * turn - 1,
        answer_seq=2 * turn,
        created_at=created_at or datetime.now(UTC),
        typed=typed,
        sent=typed,
        messages=(ChatMessage(role="system", content="你是助手"), ChatMessage(role="user", content=typed)),
        layers=(TraceLayer(name="recent", allocated=100, used=20, items=2, dropped_seqs=(1,)),),
        processors={"detector": "OfflineDetector"},
        model="stub",
        ttft_ms=1.5,
    )


async def check_concurrent_writers(stores: list[Store], *, turns_each: int = 200) -> None:
    """Writers, one per store connection, append ``turns_each`` turns each to one session.

    Odd writers use compare-and-set and retry on conflict, even ones the plain
    append. Asserts that every turn is there once, without gaps, and that each
    writer's own turns kept their order. Closes the stores.
    """

    async def writer(k: int) -> None:
        store = stores[k]
        for i in range(turns_each):
            turn = new_turns(1, prefix=f"w{k}:{i}")
            if k % 2:
                while True:
                    last = (await store.version(SessionKey("t", "shared"))).last_seq
                    try:
                        await store.append(SessionKey("t", "shared"), turn, expected_last_seq=last)
                        break
                    except ConflictError:
                        continue
            else:
                await store.append(SessionKey("t", "shared"), turn)

    try:
        await asyncio.gather(*(writer(k) for k in range(len(stores))))
        turns = await stores[0].turns(SessionKey("t", "shared"))
    finally:
        for store in stores:
            await store.close()
    assert [t.seq for t in turns] == list(range(1, len(stores) * turns_each + 1))
    by_writer: dict[str, list[int]] = {}
    for turn in turns:
        writer_id, index = turn.content.split()[0].split(":")
        by_writer.setdefault(writer_id, []).append(int(index))
    assert sorted(by_writer) == sorted(f"w{k}" for k in range(len(stores)))
    assert all(indexes == list(range(turns_each)) for indexes in by_writer.values())


async def _index_matches_the_log(store: Store, tenant: str, session_id: str) -> None:
    """The stored postings and statistics equal the whole log indexed in one pass."""
    turns = await store.turns(SessionKey(tenant, session_id))
    assert has_postings(store)
    expected = postings_for(turns, None)
    want: dict[str, list[tuple[int, bytes]]] = {}
    for term, block, data in expected.rows:
        want.setdefault(term, []).append((block, data))
    stored = await store.postings(SessionKey(tenant, session_id), sorted(want))
    assert {t: unpack(r).tolist() for t, r in stored.items()} == {t: unpack(sorted(r)).tolist() for t, r in want.items()}
    stats = await store.index_stats(SessionKey(tenant, session_id))
    assert (stats.indexed_seq, stats.docs) == (len(turns), expected.docs)
    counts = await store.term_counts(SessionKey(tenant, session_id), sorted(want))
    assert counts == {t: len(unpack(r)) for t, r in want.items()}


async def check_appends_after_another_worker_index_right(one: Store, two: Store) -> None:
    """Two connections to one store append to a session in turns (each one's kept head of
    the session goes stale), one turn at a time across a block's seal, and after the session
    was deleted and written again up to the same seq by the other (the turn before the next
    append differs although its seq does not): the index equals the log indexed in one pass."""
    from ..store.postings import BLOCK

    def pair(word: str) -> list[NewTurn]:
        return [NewTurn(role="user", content=f"{word} question", tokens=2),
                NewTurn(role="assistant", content=f"{word} answer", tokens=2)]

    tenant, sid = "t", unique_id()
    await one.append(SessionKey(tenant, sid), pair("apple"))
    await two.append(SessionKey(tenant, sid), pair("banana"))  # one's kept head of the session is stale now
    await one.append(SessionKey(tenant, sid), pair("cherry"))
    await _index_matches_the_log(one, tenant, sid)
    assert await two.delete(SessionKey(tenant, sid))
    await two.append(SessionKey(tenant, sid), pair("damson") + pair("elder") + pair("fig"))  # seq 6 again
    await one.append(SessionKey(tenant, sid), pair("grape"))
    await _index_matches_the_log(two, tenant, sid)
    await one.append(SessionKey(tenant, sid), new_turns(BLOCK - 16, prefix="bulk"))
    for i in range(8):  # single turns across the seal at seq BLOCK, mostly from one worker
        await (two if i % 3 == 2 else one).append(
            SessionKey(tenant, sid), [NewTurn(role="user", content=f"kiwi {i}", tokens=1)]
        )
    await _index_matches_the_log(one, tenant, sid)
