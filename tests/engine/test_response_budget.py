"""The response path's memory calls share one budget relative to the session's replies
(`engine/pace.py`, issue "the reply first"): past it the offline processors decide and the
user's words go on. Outcomes are asserted, never durations."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from contextmode.engine import Engine
from contextmode.engine.pace import ReplyPace
from contextmode.engine.seams import Processors
from contextmode.errors import ConfigError, ModelTimeout
from contextmode.models.calls import PROMPT_ESTIMATE, call_log
from contextmode.models.priority import in_background, response_budget, response_time_left
from contextmode.processors.llm import LLMRewriter
from contextmode.processors.rewrite import OfflineRewriter
from contextmode.settings import EngineSettings
from contextmode.store import MemoryStore
from contextmode.testing import CharTokenCounter
from contextmode.testing.models import FunctionModel
from contextmode.tokens.tools import count_messages
from contextmode.types import ChatMessage, SessionKey

A, B = SessionKey("t", "a"), SessionKey("t", "b")


def test_a_sessions_budget_is_its_typical_reply_times_the_share() -> None:
    pace = ReplyPace()
    assert pace.budget(A, share=1.0, minimum=1.0) is None  # nothing measured: each call's own timeout
    for seconds in (2.0, 9.0, 3.0):
        pace.record(A, seconds)
    assert pace.typical(A) == 3.0  # the median: one long reply does not move it
    assert pace.budget(A, share=2.0, minimum=1.0) == 6.0
    assert pace.budget(A, share=0.1, minimum=1.0) == 1.0  # never below the minimum
    assert pace.budget(A, share=0.0, minimum=1.0) is None  # 0: no shared budget
    # A session with no reply yet goes by the engine's.
    assert pace.typical(B) == 3.0
    pace.record(B, 20.0)
    assert pace.typical(B) == 20.0 and pace.typical(A) == 3.0
    pace.forget(A)
    assert pace.typical(A) == pace.typical(SessionKey("t", "new"))


def test_only_the_newest_replies_count_and_sessions_are_bounded() -> None:
    pace = ReplyPace()
    pace.SESSIONS = 3
    for seconds in (50.0, 50.0, 1.0, 1.0, 1.0, 1.0, 1.0):
        pace.record(A, seconds)
    assert pace.typical(A) == 1.0
    for i in range(5):
        pace.record(SessionKey("t", f"s{i}"), 1.0)
    assert A not in pace._sessions and len(pace._sessions) == 3


def test_the_settings_read_the_budget_and_refuse_a_negative_one() -> None:
    settings = EngineSettings.from_env({"CONTEXTMODE_RESPONSE_SHARE": "0.5", "CONTEXTMODE_RESPONSE_MIN_S": "2"})
    assert (settings.response_share, settings.response_min_s) == (0.5, 2.0)
    with pytest.raises(ConfigError, match="CONTEXTMODE_RESPONSE_SHARE"):
        EngineSettings.from_env({"CONTEXTMODE_RESPONSE_SHARE": "-1"})
    with pytest.raises(ConfigError, match="must be a number"):
        EngineSettings.from_env({"CONTEXTMODE_RESPONSE_MIN_S": "soon"})


async def test_a_background_call_is_outside_the_budget() -> None:
    with response_budget(5.0):
        left = response_time_left()
        assert left is not None and 0 < left <= 5.0

        async def job() -> float | None:
            return response_time_left()

        assert await in_background(job()) is None
    assert response_time_left() is None


HISTORY = ("My wife and I plan a trip to Kyoto in April.", "Kyoto in April is lovely: cherry blossoms.")


def _engine(rewrite_model: FunctionModel, **settings: object) -> tuple[Engine, FunctionModel]:
    async def reply(messages: Sequence[ChatMessage]) -> str:
        await asyncio.sleep(0.01)  # a quick reply: the session's budget is its minimum
        return "Sure."

    model = FunctionModel(reply)
    offline = Processors.offline()
    engine = Engine(
        store=MemoryStore(), model=model, counter=CharTokenCounter(),
        processors=Processors(detector=offline.detector, rewriter=LLMRewriter(rewrite_model, fallback=OfflineRewriter()),
                              summarizer=offline.summarizer, extractor=offline.extractor, emotion=offline.emotion),
        settings=EngineSettings(job_attempts=1, **settings),  # type: ignore[arg-type]
    )
    return engine, model


async def test_a_rewrite_past_the_budget_is_cut_and_the_offline_rewriter_decides() -> None:
    finished: list[str] = []

    async def slow(messages: Sequence[ChatMessage]) -> str:
        await asyncio.sleep(30)  # a model far slower than the session's replies
        finished.append("rewrite")
        return "How much does a trip to Kyoto in April cost?"

    engine, model = _engine(FunctionModel(slow), response_min_s=0.05)
    await engine.turn("t", "trip", HISTORY[0])
    result = await engine.turn("t", "trip", "How much would it cost?")
    rewrite = result.prepared.rewrite
    assert finished == [] and rewrite is not None and rewrite.source != "llm"  # cut; offline decided
    assert model.calls[-1].last_user.endswith("How much would it cost?")  # the user's words reach the model
    await engine.close()


async def test_a_spent_budget_asks_no_model_and_without_a_budget_the_model_is_waited_for() -> None:
    asked: list[str] = []

    async def quick(messages: Sequence[ChatMessage]) -> str:
        asked.append("rewrite")
        await asyncio.sleep(0.05)  # slower than the replies' 0.01 s, quicker than the call's timeout
        return "How much does the Kyoto trip in April cost?"

    engine, _ = _engine(FunctionModel(quick), response_share=0)
    await engine.turn("t", "trip", HISTORY[0])
    result = await engine.turn("t", "trip", "How much would it cost?")
    assert asked and result.prepared.rewrite is not None and result.prepared.rewrite.source == "llm"
    await engine.close()
    with response_budget(0.0):
        rewriter = LLMRewriter(FunctionModel(quick))
        with pytest.raises(ModelTimeout, match="budget was spent"):
            from contextmode.processors.llm import REWRITE, _ask
            await _ask(rewriter.model, REWRITE, chinese=False, max_tokens=8, message="it?", summary="", history="")
        assert call_log().calls[-1].outcome == "not asked: the response path's budget was spent"


# -- a response-path prompt the server reads in time --------------------------------------------

def _measured(rate: float, calls: int = 3) -> None:
    """Calls in this loop's log whose prompts the server read at ``rate`` tokens per second."""
    from contextmode.models.calls import CallMeter

    log = call_log()
    for _ in range(calls):
        log._add(CallMeter(step="reply", priority="reply", session="", asked=0.0, admitted=1.0,
                           first_chunk=1.0 + 1000 / rate, ended=50.0, prompt_size=1000))


async def test_the_servers_prompt_rate_is_the_median_of_its_newest_calls() -> None:
    assert call_log().prompt_rate() is None
    _measured(100.0)
    _measured(400.0, calls=1)
    assert call_log().prompt_rate() == pytest.approx(100.0)


def _wrote(tokens_per_s: float, calls: int = 3, *, reported: bool = False) -> None:
    """Calls in this loop's log that streamed 100 tokens at ``tokens_per_s`` after their first chunk
    (counted as chunks, or as the server's own count when ``reported``)."""
    from contextmode.models.calls import CallMeter

    log = call_log()
    for _ in range(calls):
        log._add(CallMeter(step="reply", priority="reply", session="", asked=0.0, admitted=1.0, first_chunk=2.0,
                           last_chunk=2.0 + 100 / tokens_per_s, ended=3.0 + 100 / tokens_per_s,
                           chunks=7 if reported else 100, completion_tokens=100 if reported else None))


async def test_the_servers_output_rate_is_the_median_of_its_newest_calls() -> None:
    log = call_log()
    assert log.output_rate() is None and log.output_in_time(60.0, 1000) is None
    _wrote(10.0, calls=2)
    _wrote(40.0, calls=3, reported=True)  # the server's own count when it gives one
    assert log.output_rate() == pytest.approx(40.0)
    log.note("rewrite", "", "not asked")  # a call that sent nothing does not count
    assert log.output_rate() == pytest.approx(40.0)


async def test_a_silence_after_the_last_chunk_is_not_writing_time() -> None:
    """A reply cut at its deadline after a long silence (a server making tokens it cannot send)
    measures the rate it wrote at; counted to its end it would size every later call to a few
    tokens, too few to measure the rate again."""
    from contextmode.models.calls import MIN_OUTPUT, CallMeter

    log = call_log()
    log._add(CallMeter(step="reply", priority="reply", session="", asked=0.0, admitted=0.0, first_chunk=1.0,
                       last_chunk=3.0, ended=120.0, chunks=60))
    assert log.output_rate() == pytest.approx(30.0)
    for _ in range(2):  # calls as short as the fewest allowed still measure the rate
        log._add(CallMeter(step="reply", priority="reply", session="", asked=0.0, admitted=0.0, first_chunk=1.0,
                           last_chunk=1.5, ended=1.6, chunks=MIN_OUTPUT))
    assert log.output_rate() == pytest.approx(MIN_OUTPUT / 0.5)


async def test_what_fits_in_time_is_the_output_after_the_prompt_is_read() -> None:
    from contextmode.models.calls import MIN_OUTPUT, OUTPUT_SHARE

    log = call_log()
    _wrote(20.0)
    assert log.output_in_time(60.0, 1000) == int(20.0 * 60.0 * OUTPUT_SHARE)  # no prompt rate yet: no reading time
    _measured(100.0)  # 1,000 prompt tokens take 10 s to read
    assert log.output_in_time(60.0, 1000) == int(20.0 * 50.0 * OUTPUT_SHARE)
    assert log.output_in_time(60.0, None) == int(20.0 * 60.0 * OUTPUT_SHARE)
    assert log.output_in_time(5.0, 1000) == MIN_OUTPUT  # past its time already: cut at the deadline anyway


HISTORY_TURNS = [
    f"{role}: {text}" for role, text in (("user", "We plan a trip to Kyoto in April, two people."),
                                          ("assistant", "Kyoto in April: cherry blossoms. " * 20))
]


async def test_a_response_path_prompt_is_cut_to_what_the_server_reads_in_its_time() -> None:
    from contextmode.processors.window import ModelWindow
    from contextmode.testing.models import ScriptedModel
    from contextmode.types import Turn

    history = [Turn(seq=i + 1, role="user" if i % 2 == 0 else "assistant", content=t.split(": ", 1)[1],
                    tokens=len(t), created_at=__import__("datetime").datetime.now(__import__("datetime").UTC))
               for i, t in enumerate(HISTORY_TURNS)]
    window = ModelWindow(tokens=4096, counter=CharTokenCounter())
    whole = ScriptedModel(["How much does the Kyoto trip cost?\n"])
    await LLMRewriter(whole, window=window).rewrite("How much would it cost?", history)
    _measured(2000.0)  # 2,000 tokens a second: the rewriter's 15 s read everything
    roomy = ScriptedModel(["How much does the Kyoto trip cost?\n"])
    await LLMRewriter(roomy, window=window).rewrite("How much would it cost?", history)
    assert roomy.calls[0].messages == whole.calls[0].messages
    tight = ScriptedModel(["How much does the Kyoto trip cost?\n"])
    full = count_messages(PROMPT_ESTIMATE, whole.calls[0].messages)
    with response_budget(2 * (full - 60) / 2000):  # time to read all but 60 tokens: the newest history kept
        result = await LLMRewriter(tight, window=window).rewrite("How much would it cost?", history)
    sent = tight.calls[0].messages
    assert sum(len(m.content) for m in sent) < sum(len(m.content) for m in whole.calls[0].messages)
    assert "cherry blossoms." in sent[-1].content and "How much would it cost?" in sent[-1].content
    assert result.text == "How much does the Kyoto trip cost?"
    # With 0.05 s (50 tokens) not even the instructions are read in time: not asked.
    unasked = ScriptedModel([])
    with response_budget(0.05):
        result = await LLMRewriter(unasked, window=window).rewrite("How much would it cost?", history)
    assert unasked.calls == [] and not result.changed
    assert call_log().calls[-1].outcome.startswith("not asked: its shortest prompt takes the server longer")


# -- a reply that fits the server's window when counts are estimates ----------------------------

@pytest.mark.parametrize("agent", [False, True], ids=["reply", "agent step"])
@pytest.mark.parametrize("estimated", [True, False])
async def test_with_estimated_counts_a_full_window_caps_the_reply_at_what_is_left(estimated: bool, agent: bool) -> None:
    from contextmode.engine.agent import AgentRequest
    from contextmode.tokens.estimate import EstimateCounter

    model = FunctionModel(lambda messages: "好的。")
    counter = EstimateCounter(quiet=True) if estimated else CharTokenCounter()
    engine = Engine(store=MemoryStore(), model=model, counter=counter, processors=Processors.offline(),
                    settings=EngineSettings(context_window=512, job_attempts=1, summary_threshold=1000))
    for i in range(60):  # far more than the window holds, in small turns: the window fills to its brim
        await engine.record("t", "full", "user" if i % 2 == 0 else "assistant", f"西湖边第{i}家茶馆安静吗？")
    if agent:
        events = [e async for e in engine.stream_agent(SessionKey("t", "full"), AgentRequest(message="还有别的吗？"))]
        result = next(e.result for e in events if e.kind == "done")
    else:
        result = await engine.turn("t", "full", "还有别的吗？")
    cap = model.calls[-1].max_tokens
    total = result.prepared.context.total_tokens
    assert total > (512 - engine.budget().reserve) / 1.1  # the window is full: a 10 % miss would overflow
    if estimated:  # a few percent low would overflow the server's window: the reply gives way
        assert cap is not None and 1 <= cap < engine.budget().reserve
        assert total * 1.1 + cap <= 512 + 1
    else:
        assert cap is None  # exact counts: the model's own cap
    await engine.close()
