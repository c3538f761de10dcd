"""A model server shared by replies and background jobs (`models.priority`, `models.calls`): a
reply cuts a running background call short, a JSON call ends when its object is complete, a
stream that only pads with blanks is stopped, and every call is logged with its step, priority
and wait. On the stub server reporting llama.cpp's one slot; orders and outcomes, never durations."""

from __future__ import annotations

import asyncio
import threading

import pytest

pytest.importorskip("openai")

from contextmode.errors import ModelPreempted
from contextmode.jobs import JobRunner, JobSettings
from contextmode.models import OpenAIChatModel
from contextmode.models.base import JsonSchema
from contextmode.models.calls import call_log, model_step
from contextmode.models.openai import json_complete
from contextmode.models.priority import in_background
from contextmode.testing.stub_server import StubRequest

from .test_priority import held, llamacpp, said, until

SCHEMA = JsonSchema(name="emotion", schema={"type": "object", "properties": {"intensity": {"type": "number"}}})


async def test_a_reply_cuts_a_running_background_job_short_and_the_job_runs_again_after_it() -> None:
    release = threading.Event()
    server = llamacpp(held(release, "job"), slots=1)
    answers: list[str] = []
    with server as url:
        model = OpenAIChatModel(model="smollm2", base_url=url, max_retries=0)
        gate = await model.slot_gate()
        assert gate is not None
        failed: list[str] = []

        class Hooks:
            def job_scheduled(self, job: str) -> None:
                pass

            def job_failed(self, job: str) -> None:
                failed.append(job)

        runner = JobRunner(None, JobSettings(base_delay_s=0.0), hooks=Hooks())

        async def job() -> None:
            with model_step("emotion", session="s"):
                answers.append(await model.complete(said("job")))

        runner.schedule("t", "s", "emotion", lambda: in_background(job()))
        await until(lambda: len(server.chat_requests) == 1)
        reply = await model.complete(said("the user"))  # does not wait for the held job
        assert reply == "answer to the user" and gate.preempted == 1
        release.set()
        await runner.drain()
    # Cut short once, then run again after the reply: not a failed attempt.
    assert [r.last_user for r in server.chat_requests] == ["job", "the user", "job"]
    assert answers == ["answer to job"]
    assert failed == []  # the cut attempt is not a failed one: it is tried again, not counted
    steps = [(c.step, c.priority, c.outcome) for c in call_log().between(0.0)]
    assert ("emotion", "background", "preempted") in steps
    assert ("reply", "reply", "stop") in steps


async def test_a_preempted_call_raises_model_preempted_to_its_caller() -> None:
    release = threading.Event()
    server = llamacpp(held(release, "job"), slots=1)
    with server as url:
        model = OpenAIChatModel(model="smollm2", base_url=url, max_retries=0)
        job = asyncio.create_task(in_background(model.complete(said("job"))))
        await until(lambda: len(server.chat_requests) == 1)
        reply = asyncio.create_task(model.complete(said("the user")))
        with pytest.raises(ModelPreempted):
            await job
        release.set()
        assert await reply == "answer to the user"
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_a_json_call_ends_when_its_object_is_complete() -> None:
    def padded(request: StubRequest) -> str:
        return '{"intensity": 0.4}' + " " * 400  # a grammar lets a small model pad to its cap

    with llamacpp(padded, slots=1) as url:
        model = OpenAIChatModel(model="smollm2", base_url=url, max_retries=0)
        await model.slot_gate()
        with model_step("emotion"):
            answer = await in_background(model.complete_json(said("x"), schema=SCHEMA, max_tokens=200))
    assert answer.strip() == '{"intensity": 0.4}'
    last = [c for c in call_log().between(0.0) if c.step == "emotion"][-1]
    assert last.outcome == "stop (the JSON object was complete)"
    assert last.completion_tokens is not None and last.completion_tokens < 20  # 4 characters a chunk


async def test_a_reply_that_only_pads_with_blanks_is_stopped() -> None:
    with llamacpp(lambda request: "Hello" + " \n" * 600, slots=1) as url:
        model = OpenAIChatModel(model="smollm2", base_url=url, max_retries=0)
        await model.slot_gate()
        text = "".join([d async for d in model.stream(said("hi"))])
    assert text.startswith("Hello") and len(text) < 600
    assert model.last_finish_reason == "length"
    assert [c for c in call_log().between(0.0)][-1].outcome == "stopped early: the reply went blank"


def test_json_complete_reads_strings_and_nesting() -> None:
    assert json_complete('{"a": [1, {"b": "}"}]}   ')
    assert json_complete('  {"quote": "a \\" } b"}')
    assert not json_complete('{"a": [1, {"b": 2}]')
    assert not json_complete('{"a": "}')
    assert not json_complete("no json {}") and not json_complete("")


async def test_a_streamed_call_is_measured_for_the_servers_prompt_rate(server: object) -> None:
    from contextmode.models.calls import PROMPT_ESTIMATE, estimate_prompt
    from contextmode.testing.stub_server import StubServer
    from contextmode.tokens.tools import count_messages
    from contextmode.types import ChatMessage

    assert isinstance(server, StubServer)
    model = OpenAIChatModel(model="stub-model", base_url=server.url, max_retries=0)
    messages = [ChatMessage(role="system", content="You rewrite queries. " * 20), *said("the user")]
    assert call_log().prompt_rate() is None
    "".join([d async for d in model.stream(messages)])
    meter = call_log().calls[-1]
    # llama-cpp-python reports no usage while streaming: the prompt is measured on our side.
    assert meter.prompt_size == count_messages(PROMPT_ESTIMATE, messages) == estimate_prompt(
        [{"role": m.role, "content": m.content} for m in messages])
    assert meter.first_chunk is not None and meter.admitted is not None and meter.first_chunk >= meter.admitted
    assert call_log().prompt_rate() is not None


async def test_a_call_is_sized_to_end_by_its_deadline_at_the_servers_measured_rate(server: object) -> None:
    """A server that notices a closed stream only as it sends a chunk (llama-cpp-python, on tokens
    that do not decode) would go on generating a reply stopped at its deadline: a call asks for
    no more than the server writes before the deadline comes."""
    from contextmode.models.base import Relay
    from contextmode.models.calls import CallMeter
    from contextmode.testing.stub_server import StubServer

    assert isinstance(server, StubServer)
    from contextmode.models.openai import OpenAIOptions

    model = OpenAIChatModel(model="stub-model", base_url=server.url, max_retries=0,
                            options=OpenAIOptions(deadline=30.0))
    "".join([d async for d in model.stream(said("first"), max_tokens=2000)])
    assert server.chat_requests[-1].body["max_tokens"] == 2000  # nothing measured yet: as asked
    log = call_log()
    for _ in range(3):  # a server writing 10 tokens a second
        log._add(CallMeter(step="reply", priority="reply", session="", asked=0.0, admitted=1.0, first_chunk=2.0,
                           last_chunk=12.0, ended=12.0, chunks=100))
    "".join([d async for d in model.stream(said("second"), max_tokens=2000)])
    sized = server.chat_requests[-1].body["max_tokens"]
    assert 200 <= sized <= 10 * 30  # about what 30 s hold at 10 tokens a second, less reading time
    "".join([d async for d in model.stream(said("short"), max_tokens=50)])
    assert server.chat_requests[-1].body["max_tokens"] == 50  # a cap that fits stays
    relayed = Relay(fields={"messages": [{"role": "user", "content": "relayed"}], "max_completion_tokens": 5000},
                    stream=True)
    [e async for e in model.relay(None, relayed)]
    body = server.chat_requests[-1].body
    assert "max_tokens" not in body and 200 <= body["max_completion_tokens"] <= 300  # under the client's own name


@pytest.mark.parametrize("valid_text", [True, False])
async def test_a_server_that_stalls_on_broken_text_is_asked_for_valid_utf8_in_chinese(
    server: object, valid_text: bool,
) -> None:
    """llama-cpp-python sends nothing more once a model writes bytes that do not decode, and spends
    ever longer on each later token: text calls in Chinese ask it for valid UTF-8 (a grammar)."""
    from contextmode.models.base import Relay
    from contextmode.models.openai import VALID_TEXT, OpenAIOptions
    from contextmode.models.server import ServerInfo
    from contextmode.testing.stub_server import StubServer

    assert isinstance(server, StubServer)
    info = ServerInfo(kind="llamacpp", slots=0, stalls_on_broken_text=True)
    model = OpenAIChatModel(model="stub-model", base_url=server.url, max_retries=0,
                            options=OpenAIOptions(server_info=info, valid_text=valid_text))
    "".join([d async for d in model.stream(said("推荐一家杭州的餐厅。"))])
    assert server.chat_requests[-1].body.get("grammar") == (VALID_TEXT if valid_text else None)
    "".join([d async for d in model.stream(said("Recommend a café in Hangzhou."))])
    assert "grammar" not in server.chat_requests[-1].body  # no character of three bytes: no stall to fear
    await model.complete_json(said("心情如何？"), schema=SCHEMA, max_tokens=20)
    assert server.chat_requests[-1].body.get("grammar") is None  # a JSON call has its own grammar
    [e async for e in model.relay(None, Relay(fields={"messages": [{"role": "user", "content": "它在哪？"}]}, stream=True))]
    assert server.chat_requests[-1].body.get("grammar") == (VALID_TEXT if valid_text else None)
    other = OpenAIChatModel(model="stub-model", base_url=server.url, max_retries=0,
                            options=OpenAIOptions(server_info=ServerInfo(kind="llamacpp", slots=0)))
    "".join([d async for d in other.stream(said("推荐一家杭州的餐厅。"))])
    assert "grammar" not in server.chat_requests[-1].body  # llama.cpp's own server sends what it has


def test_valid_text_is_read_from_the_environment() -> None:
    from contextmode.errors import ConfigError
    from contextmode.models import LLMSettings

    assert LLMSettings.from_env({}).valid_text is True
    assert LLMSettings.from_env({"CONTEXTMODE_LLM_VALID_TEXT": "0"}).valid_text is False
    with pytest.raises(ConfigError, match="CONTEXTMODE_LLM_VALID_TEXT"):
        LLMSettings.from_env({"CONTEXTMODE_LLM_VALID_TEXT": "maybe"})
