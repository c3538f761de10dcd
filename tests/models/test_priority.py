"""Replies before background jobs on an endpoint with few slots (`models.priority`): the gate
itself, then `OpenAIChatModel` on the stub server reporting llama.cpp's ``total_slots``, then
the engine's jobs. Orders are observed, never durations."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable

import pytest

from contextmode.types import SessionKey

pytest.importorskip("openai")

from contextmode.api import build_engine
from contextmode.errors import ModelDeferred, ModelPreempted
from contextmode.jobs import JobRunner, JobSettings
from contextmode.models import LLMSettings, OpenAIChatModel, OpenAIOptions
from contextmode.models.calls import call_log
from contextmode.models.priority import (
    CallPriority,
    GateState,
    PriorityGate,
    Replies,
    answering,
    call_priority,
    endpoint_gate,
    in_background,
    paused_limits,
    waits_excluded,
)
from contextmode.models.server import probe_server
from contextmode.store import MemoryStore
from contextmode.testing.stub_server import StubOptions, StubRequest, StubServer
from contextmode.types import ChatMessage


async def until(predicate: Callable[[], bool], tries: int = 500) -> None:
    """Let the loop run until ``predicate`` holds (fails the test if it never does)."""
    for _ in range(tries):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


def said(text: str) -> list[ChatMessage]:
    return [ChatMessage(role="user", content=text)]


# -- the gate ------------------------------------------------------------------------------------

async def test_a_reply_takes_the_next_slot_before_background_calls_that_waited_longer() -> None:
    gate, order = PriorityGate(1), []

    async def call(name: str, priority: CallPriority) -> None:
        await gate.acquire(priority)
        order.append(name)
        gate.release(priority)

    await gate.acquire("background")  # a background call is running
    waiting = [asyncio.create_task(call(f"job-{i}", "background")) for i in (1, 2)]
    await until(lambda: gate.state().background_waiting == 2)
    reply = asyncio.create_task(call("reply", "reply"))
    await until(lambda: gate.state().replies_waiting == 1)
    gate.release("background")  # the running background call ends (it was not cut short)
    await asyncio.gather(reply, *waiting)
    assert order == ["reply", "job-1", "job-2"]
    assert gate.state().running == 0


async def test_background_calls_take_free_slots_but_never_one_a_reply_waits_for() -> None:
    gate = PriorityGate(2)
    await gate.acquire("background")
    await gate.acquire("reply")  # both slots busy
    queued_reply = asyncio.create_task(gate.acquire("reply"))
    await until(lambda: gate.state().replies_waiting == 1)
    late_job = asyncio.create_task(gate.acquire("background"))
    await until(lambda: gate.state().background_waiting == 1)
    gate.release("background")
    await queued_reply
    assert not late_job.done() and gate.state().running == 2
    gate.release("reply")
    await late_job
    assert gate.state() == GateState(slots=2, running=2, replies_waiting=0, background_waiting=0)


async def test_with_more_slots_a_turn_keeps_one_free_and_background_calls_use_the_rest() -> None:
    replies = Replies()
    gate = PriorityGate(3, replies=replies)
    with replies.answering():  # a turn between two of its calls: one slot kept for it
        await gate.acquire("background")
        await gate.acquire("background")
        third = asyncio.create_task(gate.acquire("background"))
        await until(lambda: gate.state().background_waiting == 1)
        await gate.acquire("reply")  # the turn's next call takes the kept slot at once
        assert gate.state().running == 3
        gate.release("reply")
        assert not third.done()
    await third  # the turn is over: nothing is kept
    assert gate.state().running == 3


async def test_as_a_turn_ends_the_slot_stays_kept_a_moment_for_the_clients_next_message() -> None:
    replies = Replies(settle_s=0.2)
    gate = PriorityGate(1, replies=replies)
    with replies.answering():
        job = asyncio.create_task(gate.acquire("background"))
        await until(lambda: gate.state().background_waiting == 1)
    # The turn is over, but it ended a moment ago: the next turn's first call finds the slot free
    # (nothing to cut), and the job waits its turn.
    assert replies.settling() and not job.done()
    with replies.answering():
        await gate.acquire("reply")
        assert gate.preempted == 0 and not job.done()
        gate.release("reply")
    await job  # let go once the last turn has settled, without another call to wake it
    assert gate.state().running == 1 and gate.preempted == 0 and not replies.settling()


async def test_without_a_settle_time_the_slot_is_free_as_the_turn_ends() -> None:
    replies = Replies(settle_s=0)
    gate = PriorityGate(1, replies=replies)
    with replies.answering():
        job = asyncio.create_task(gate.acquire("background"))
        await until(lambda: gate.state().background_waiting == 1)
    await until(job.done)


async def test_a_background_calls_wait_for_a_slot_does_not_count_in_the_limits_around_it() -> None:
    gate = PriorityGate(1)
    await gate.acquire("reply")
    waited = asyncio.Event()

    async def job() -> str:
        async with asyncio.timeout(0.05) as limit:
            with waits_excluded(limit):
                with paused_limits():  # as the model does around a background call's wait
                    waited.set()
                    await gate.acquire("background")
                await asyncio.sleep(0.01)  # the call itself, well within its limit
        return "ran"

    task = asyncio.create_task(job())
    await waited.wait()
    await asyncio.sleep(0.2)  # the reply holds the slot four times the job's limit
    assert not task.done()
    gate.release("reply")
    assert await task == "ran"


async def test_a_background_call_waiting_too_long_gives_up_and_leaves_the_queue() -> None:
    gate = PriorityGate(1)
    await gate.acquire("reply")
    with pytest.raises(ModelDeferred, match=r"gave up after waiting 0.01 s for a free slot"):
        await gate.acquire("background", wait_s=0.01)
    cancelled = asyncio.create_task(gate.acquire("background"))  # no limit: cancelled at shutdown
    await until(lambda: gate.state().background_waiting == 1)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert gate.state().background_waiting == 0
    gate.release("reply")
    assert gate.state().running == 0  # nobody was handed the slot


async def test_background_calls_wait_while_a_turn_is_being_answered() -> None:
    gate = endpoint_gate("http://turn.test/v1", 1)
    assert gate is not None
    order: list[str] = []

    async def call(name: str, priority: CallPriority) -> None:
        await gate.acquire(priority)
        order.append(name)
        gate.release(priority)

    async def turn() -> AsyncIterator[str]:
        for step in ("detect", "rewrite", "reply"):
            await call(step, "reply")
            yield step

    events = answering(turn())
    assert await anext(events) == "detect"
    job = asyncio.create_task(call("job", "background"))
    await until(lambda: gate.state().background_waiting == 1)
    assert gate.state().running == 0  # the slot is free, but the turn is not over
    assert [step async for step in events] == ["rewrite", "reply"]
    await job
    assert order == ["detect", "rewrite", "reply", "job"]


async def test_calls_are_background_only_inside_in_background() -> None:
    async def priority() -> str:
        return call_priority()

    assert await priority() == "reply"
    assert await in_background(priority()) == "background"
    assert call_priority() == "reply"
    assert endpoint_gate("http://h/v1", None) is None and endpoint_gate("http://h/v1", 0) is None
    assert endpoint_gate("http://h/v1", 1) is endpoint_gate("http://h/v1/", 1)


# -- the model on the wire -----------------------------------------------------------------------

def held(release: threading.Event, *names: str) -> Callable[[StubRequest], str]:
    """A stub reply that keeps the requests whose last user message is one of ``names`` in the
    server until ``release`` is set."""

    def reply(request: StubRequest) -> str:
        if request.last_user in names:
            release.wait(30)
        return f"answer to {request.last_user}"

    return reply


def received(server: StubServer, count: int) -> Callable[[], bool]:
    return lambda: len(server.chat_requests) == count


def llamacpp(reply: Callable[[StubRequest], str], slots: int | None) -> StubServer:
    return StubServer(reply, model="smollm2", llamacpp_window=2048, options=StubOptions(llamacpp_slots=slots))


async def test_with_one_slot_a_reply_reaches_the_server_before_queued_background_calls() -> None:
    release = threading.Event()
    server = llamacpp(held(release, "job-1"), slots=1)
    with server as url:
        assert probe_server(url, "smollm2").slots == 1
        model = OpenAIChatModel(model="smollm2", base_url=url, max_retries=0)
        gate = await model.slot_gate()
        assert gate is not None
        running = asyncio.create_task(in_background(model.complete(said("job-1"))))
        await until(lambda: len(server.chat_requests) == 1)
        queued = [asyncio.create_task(in_background(model.complete(said(f"job-{i}")))) for i in (2, 3)]
        await until(lambda: gate.state().background_waiting == 2)
        reply = asyncio.create_task(model.complete(said("the user")))
        # The running background call is cut short for the reply (its stream closed: the server
        # stops generating); the job gets ModelPreempted and tries again later.
        with pytest.raises(ModelPreempted):
            await running
        assert gate.preempted == 1
        release.set()
        answers = await asyncio.gather(*queued, reply)
    assert answers[-1] == "answer to the user"
    assert [r.last_user for r in server.chat_requests] == ["job-1", "the user", "job-2", "job-3"]


async def test_a_streamed_reply_holds_the_slot_until_it_ends() -> None:
    release = threading.Event()
    server = llamacpp(held(release, "the user"), slots=1)
    with server as url:
        model = OpenAIChatModel(model="smollm2", base_url=url, max_retries=0)
        gate = await model.slot_gate()
        assert gate is not None

        async def read_reply() -> str:
            return "".join([delta async for delta in model.stream(said("the user"))])

        reply = asyncio.create_task(read_reply())
        await until(lambda: len(server.chat_requests) == 1)
        job = asyncio.create_task(in_background(model.complete(said("job"))))
        await until(lambda: gate.state().background_waiting == 1)
        release.set()
        assert await reply == "answer to the user"
        assert await job == "answer to job"
    assert [r.last_user for r in server.chat_requests] == ["the user", "job"]


async def test_with_enough_slots_or_no_known_limit_nothing_waits() -> None:
    release = threading.Event()
    names = ("a", "b", "c")
    for server in (llamacpp(held(release, *names), slots=3), StubServer(held(release, *names))):
        release.clear()
        with server as url:
            model = OpenAIChatModel(model="smollm2", base_url=url, max_retries=0)
            calls = [asyncio.create_task(in_background(model.complete(said(n)))) for n in names]
            await until(received(server, 3))  # all three in the server at once
            release.set()
            await asyncio.gather(*calls)
    assert await OpenAIChatModel(model="m", base_url=url, options=OpenAIOptions(slots=0)).slot_gate() is None


def test_the_slot_settings_come_from_the_environment() -> None:
    from contextmode.errors import ConfigError

    default = LLMSettings.from_env({"CONTEXTMODE_LLM_MODEL": "m"})
    assert (default.slots, default.background_wait_s) == (None, 30.0)
    set_ = LLMSettings.from_env({"CONTEXTMODE_LLM_MODEL": "m", "CONTEXTMODE_LLM_SLOTS": "2",
                                 "CONTEXTMODE_LLM_BACKGROUND_WAIT_S": "0"})
    assert (set_.slots, set_.background_wait_s) == (2, None)
    with pytest.raises(ConfigError, match="CONTEXTMODE_LLM_SLOTS"):
        LLMSettings.from_env({"CONTEXTMODE_LLM_MODEL": "m", "CONTEXTMODE_LLM_SLOTS": "two"})


# -- the engine's jobs ---------------------------------------------------------------------------

async def test_jobs_waiting_behind_a_reply_too_long_are_deferred_not_failed_and_run_after_it() -> None:
    release = threading.Event()

    def reply(request: StubRequest) -> str:
        body = request.body if isinstance(request.body, dict) else {}
        if body.get("max_tokens") == 1024:  # the reply (processors have smaller caps)
            release.wait(30)
            return "Sure."
        if "upsert" in str(request.messages[0].get("content")):
            return '{"upsert": [{"key": "diet", "value": "vegetarian", "quote": "I am vegetarian"}]}'
        return '{"intensity": 0.1}' if "intensity" in str(body) else "no"

    server = llamacpp(reply, slots=1)
    with server as url:
        model = OpenAIChatModel(model="smollm2", base_url=url, max_retries=0,
                                options=OpenAIOptions(background_wait_s=0.05))
        store = MemoryStore()
        engine = build_engine(store=store, model=model, processors="llm",
                              jobs=JobRunner(store, JobSettings(attempts=1, base_delay_s=0.01)))
        gate = await model.slot_gate()
        assert gate is not None
        turn = asyncio.create_task(engine.turn("t", "busy", "Hello there"))
        await until(lambda: gate.state().running == 1 and any(
            isinstance(r.body, dict) and r.body.get("max_tokens") == 1024 for r in server.chat_requests))
        await engine.record("t", "quiet", "user", "I am vegetarian")  # schedules its unit
        await until(lambda: any(c.session == "quiet" and c.outcome.startswith("deferred")
                                for c in call_log().between(0.0)))
        # Gave up waiting for the slot: deferred, tried again; not a failed attempt.
        info = await store.info(SessionKey("t", "quiet"))
        assert info is not None and all(stats.failed == 0 for stats in info.jobs.values())
        assert engine.jobs.pending("t", "quiet") == ["memory"]
        assert (await store.load(SessionKey("t", "quiet"), recent=0)).constraints == ()
        release.set()
        assert (await turn).answer == "Sure."
        await engine.drain()
        info = await store.info(SessionKey("t", "quiet"))
        assert info is not None
        for job in ("emotion", "constraints"):
            stats = info.jobs[job]
            assert (stats.ok, stats.failed, stats.rejected) == (1, 0, 0), job
        assert [c.key for c in (await store.load(SessionKey("t", "quiet"), recent=0)).constraints] == ["diet"]
        assert gate.state().background_waiting == 0
        await engine.close()
