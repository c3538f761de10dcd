"""Replies first on a real shared local model: SmolLM2-135M-Instruct behind llama-cpp-python's
server (one request at a time). A reply started while a background call is generating gets its
first token within 2× of a reply on an idle server (a generous bound for CI's noise:
``benchmarks/real_model_shared.py`` holds the real figures), because the background call, a
stream, is cut short for it (the server stops generating within a token of the connection
closing) and tried again later. Needs the ``local-model`` extra; under a truthy ``CI`` a missing
extra fails.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Iterator

import pytest

from contextmode.errors import ModelPreempted
from contextmode.testing.ci import skip_or_fail
from contextmode.testing.local_model import LOCAL_MODEL_ALIAS, llama_server, local_model_ready
from contextmode.types import ChatMessage

pytestmark = [pytest.mark.local_model, pytest.mark.slow]

pytest.importorskip("openai")

from contextmode.models import OpenAIChatModel, OpenAIOptions  # noqa: E402
from contextmode.models.priority import in_background  # noqa: E402

QUESTIONS = ("What is the capital of France?", "Name a large river in Africa.", "Who wrote Hamlet?",
             "What do bees make?", "How many legs has a spider?", "What colour is the sky?",
             "Which planet is the largest?", "What is frozen water called?")
CONTEXT = ChatMessage(role="system", content=" ".join([
    "You help a user plan a team dinner. What you know from the conversation so far:",
    "the dinner is next Friday evening for six people; one of them is vegetarian and one is allergic",
    "to peanuts; the budget is thirty dollars per person, drinks included; two people do not drink",
    "alcohol; the office is near the central station and everyone comes from there by foot; the team",
    "would like a quiet place where they can talk, with a table for six booked in advance; the dinner",
    "should not last more than two hours because some colleagues take the last train home; the user",
    "asked earlier for a cuisine that is usually affordable and for a dessert that goes with the menu.",
]))
"""A reply's prompt carries its memory (about 150 tokens here), as the engine's replies do: the
first token then measures the prompt's evaluation, not a few milliseconds of overhead."""
LONG_JOB = [ChatMessage(role="user", content="Write a long story about a lighthouse keeper, in many paragraphs.")]


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    missing = local_model_ready()
    if missing is not None:
        skip_or_fail(f"the local-model extra is missing: {missing}")
    with llama_server(tmp_path_factory.mktemp("local-priority"), n_ctx=1024) as url:
        yield url


async def first_token_s(model: OpenAIChatModel, question: str) -> float:
    """The first token of ``question``: each measurement asks a question the server has not seen
    (a prompt the server still holds would be answered from its cache, in a fraction of the time)."""
    started = time.perf_counter()
    async for _ in model.stream([CONTEXT, ChatMessage(role="user", content=question)], max_tokens=8):
        return time.perf_counter() - started
    raise AssertionError("the reply sent no token")


@pytest.mark.parametrize("slots", [None, 1], ids=["probed", "slots-configured"])
async def test_a_reply_while_a_background_call_runs_gets_its_first_token_within_twice_an_idle_one(
    base_url: str, slots: int | None,
) -> None:
    # slots-configured: CONTEXTMODE_LLM_SLOTS set, so the server is never probed and its kind is
    # unknown; a background call is a stream all the same (a whole answer would not be cut).
    model = OpenAIChatModel(model=LOCAL_MODEL_ALIAS, base_url=base_url,
                            options=OpenAIOptions(temperature=0.0, deadline=300.0, slots=slots))
    gate = await model.slot_gate()
    assert gate is not None and gate.slots == 1  # llama-cpp-python: one request at a time
    await first_token_s(model, QUESTIONS[0])  # warm the server (the model's first request loads it)
    # Idle: right after a background call that ended by itself, so the server's prompt cache
    # holds the same as after a cut one (the reply's prompt is evaluated again either way).
    idle_after: list[float] = []
    for question in QUESTIONS[1:4]:
        await in_background(model.complete(LONG_JOB, max_tokens=16))
        idle_after.append(await first_token_s(model, question))
    idle = statistics.median(idle_after)
    busy: list[float] = []
    for question in QUESTIONS[4:7]:
        job = asyncio.create_task(in_background(model.complete(LONG_JOB, max_tokens=512)))
        for _ in range(3000):  # until the background call holds the server's one slot
            if gate.state().running == 1:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)  # and is generating
        busy.append(await first_token_s(model, question))
        with pytest.raises(ModelPreempted):
            await job
    await model.aclose()
    print(f"first token: idle {idle:.2f} s; with a background call generating {[round(b, 2) for b in busy]} s")
    assert gate.preempted == 3
    assert statistics.median(busy) <= 2 * idle, (busy, idle)


async def test_llama_cpp_python_is_asked_for_valid_utf8_and_still_answers_in_chinese(base_url: str) -> None:
    """The probe names llama-cpp-python as a server that stalls on broken text, and a Chinese reply
    is asked for valid UTF-8 (a grammar the server accepts, not a refused request)."""
    from contextmode.models.calls import call_log
    from contextmode.models.server import probe_server

    assert probe_server(base_url, LOCAL_MODEL_ALIAS).stalls_on_broken_text
    model = OpenAIChatModel(model=LOCAL_MODEL_ALIAS, base_url=base_url, max_retries=0)
    text = "".join([d async for d in model.stream([ChatMessage(role="user", content="推荐一家杭州的餐厅。")],
                                                   max_tokens=24)])
    assert text.strip()
    assert call_log().calls[-1].outcome in ("stop", "length")
