"""A real HTTP model on the wire, with the stub server: structured outputs, bounded calls, the
server's window and tokenizer, and every way the model's output is rejected."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from contextmode.types import SessionKey

pytest.importorskip("openai")

from contextmode.api import build_engine
from contextmode.engine import Engine
from contextmode.errors import ConfigError, OutputRejected
from contextmode.jobs import JobRunner, JobSettings
from contextmode.models import LLMSettings, OpenAIChatModel, OpenAIOptions
from contextmode.models.server import probe_server
from contextmode.settings import EngineSettings
from contextmode.store import MemoryStore
from contextmode.testing.counters import CharTokenCounter
from contextmode.testing.stub_server import StubRequest, StubServer
from contextmode.text.degenerate import is_looping

T, S = "t", "s"


def _model(url: str, **options: object) -> OpenAIChatModel:
    return OpenAIChatModel(model="stub-model", base_url=url, max_retries=0, timeout=5,
                           options=OpenAIOptions(**options))  # type: ignore[arg-type]


def _constraint_reply(item: dict[str, str]) -> object:
    def reply(request: StubRequest) -> str:
        system = str(request.messages[0].get("content", ""))
        if "upsert" in system:
            return json.dumps({"upsert": [item], "remove": []}, ensure_ascii=False)
        if "intensity" in system:
            return '{"intensity": 0.2}'
        return "Sure."
    return reply


async def _engine(url: str, **options: object) -> Engine:
    return build_engine(
        store=MemoryStore(), model=_model(url, **options), counter=CharTokenCounter(),
        settings=EngineSettings(), processors="llm",
    )


# -- structured outputs on the wire ------------------------------------------------------------

async def test_openai_style_servers_get_json_schema_and_llamacpp_gets_json_object() -> None:
    reply = _constraint_reply({"key": "diet", "value": "vegetarian", "kind": "fact", "quote": "vegetarian"})
    for window, expected in ((None, "json_schema"), (4096, "json_object")):
        server = StubServer(reply, llamacpp_window=window)  # type: ignore[arg-type]
        with server as url:
            engine = await _engine(url)
            await engine.turn(T, S, "I'm vegetarian")
            await engine.drain()
            sent = [r.body.get("response_format") for r in server.chat_requests if isinstance(r.body, dict)]
            formats = [f for f in sent if f]
            assert formats and all(f["type"] == expected for f in formats)
            assert all("schema" in (f.get("json_schema") or f) for f in formats)
            # background calls are streams on every server (a call cut short or abandoned at
            # its timeout stops the server's work), and a llama.cpp server gets streams only
            assert all(r.stream for r in server.chat_requests)
            state = await engine.store.load(SessionKey(T, S), recent=0)
            assert [(c.key, c.value) for c in state.constraints] == [("diet", "vegetarian")]
            info = await engine.store.info(SessionKey(T, S))
            assert info is not None and info.jobs["constraints"].ok == 1


async def test_a_refused_json_schema_steps_down_to_json_object_once() -> None:
    server = StubServer(lambda r: '{"intensity": 0.5}', llamacpp_window=4096)
    with server as url:
        model = _model(url, response_format="json_schema")
        from contextmode.models.base import JsonSchema
        from contextmode.types import ChatMessage

        schema = JsonSchema(name="x", schema={"type": "object"})
        for _ in range(2):
            assert await model.complete_json([ChatMessage(role="user", content="hi")], schema=schema) == (
                '{"intensity": 0.5}')
        types = [r.body["response_format"]["type"] for r in server.chat_requests if isinstance(r.body, dict)]
        assert types == ["json_schema", "json_object", "json_object"]


# -- rejection paths: nothing stored, counted as rejected with the reason ------------------------

@pytest.mark.parametrize(("message", "item", "reason"), [
    ("I'm vegetarian, 30 dollars per person", {"key": "diet", "value": "vegetarian", "kind": "fact"},
     "empty quote"),  # no quote at all
    ("I'm vegetarian, 30 dollars per person",
     {"key": "spice", "value": "no spicy food", "kind": "preference", "quote": "I can't eat spicy"},
     "not in the user's words"),
    ("对海鲜过敏，预算两百以内",
     {"key": "budget", "value": "预算50元以内", "kind": "constraint", "quote": "预算两百以内"},
     "numbers the user never said"),
    ("I'm vegetarian", {"key": "diet", "value": "vegetarian", "kind": "fact", "quote": ""}, "empty quote"),
    ("I can't eat spicy", {"key": "spice", "value": "no spicy", "kind": "preference",
                           "quote": "<b>I can't eat spicy"}, "markup in the quote"),
    ("I'm vegetarian", {"key": "diet", "value": "vegetarian", "kind": "wish", "quote": "vegetarian"}, "schema"),
])
async def test_invalid_output_is_a_rejected_job_and_nothing_is_stored(
    message: str, item: dict[str, str], reason: str
) -> None:
    server = StubServer(_constraint_reply(item))  # type: ignore[arg-type]
    with server as url:
        engine = await _engine(url)
        result = await engine.turn(T, S, message)
        await engine.drain()
    assert result.answer == "Sure." and not result.partial
    state = await engine.store.load(SessionKey(T, S), recent=0)
    assert state.constraints == ()
    info = await engine.store.info(SessionKey(T, S))
    assert info is not None
    stats = info.jobs["constraints"]
    assert (stats.ok, stats.rejected, stats.failed) == (0, 1, 0)  # no retries of unusable output
    assert stats.last_error is not None and reason in stats.last_error
    assert len([r for r in server.chat_requests if "upsert" in str(r.messages[0].get("content"))]) == 1


async def test_the_job_runner_counts_a_rejection_once_without_retrying() -> None:
    store = MemoryStore()
    from contextmode.types import NewTurn

    await store.append(SessionKey(T, S), [NewTurn(role="user", content="x", tokens=1)])
    calls = 0

    async def job() -> None:
        nonlocal calls
        calls += 1
        raise OutputRejected("empty quote")

    runner = JobRunner(store, JobSettings(attempts=3, base_delay_s=0))
    runner.schedule(T, S, "constraints", job)
    await runner.drain()
    info = await store.info(SessionKey(T, S))
    assert calls == 1 and info is not None
    assert (info.jobs["constraints"].rejected, info.jobs["constraints"].last_error) == (1, "empty quote")


async def test_a_summary_repeating_the_prompt_is_rejected() -> None:
    from contextmode.processors.llm import LLMSummarizer
    from contextmode.prompts import SUMMARY
    from contextmode.testing.models import ScriptedModel
    from contextmode.types import Turn, utc_now

    echo = SUMMARY.system_en.split("\n")[2]  # a line of the instructions, verbatim
    turns = [Turn(seq=1, role="user", content="I live in Lyon", tokens=4, created_at=utc_now())]
    with pytest.raises(OutputRejected, match="repeats the prompt"):
        await LLMSummarizer(ScriptedModel([echo])).summarize(None, turns)
    with pytest.raises(OutputRejected, match="repeats itself"):
        await LLMSummarizer(ScriptedModel(["The user lives in Lyon. " * 40])).summarize(None, turns)
    ok = await LLMSummarizer(ScriptedModel(["The user lives in Lyon."])).summarize(None, turns)
    assert ok.text.startswith("The user lives in Lyon.")


# -- bounded calls -----------------------------------------------------------------------------

def _looping(request: StubRequest) -> Iterator[str]:
    yield "好的，我来回答。"
    for _ in range(2000):
        yield "我很高兴为你服务，"


async def test_a_runaway_stream_ends_as_length_keeping_the_partial_reply() -> None:
    server = StubServer(_looping)
    with server as url:
        model = _model(url, reply_max_tokens=None)
        engine = build_engine(store=MemoryStore(), model=model, counter=CharTokenCounter())
        result = await engine.turn(T, S, "你好")
        requests = len(server.chat_requests)
    # The engine's reply guard (`text.degenerate`) stops it first (the model's own check is the
    # backstop for a caller streaming without the engine).
    assert result.assistant_turn is not None
    assert result.assistant_turn.metadata["stopped"] == "the reply repeats itself"
    assert result.answer.startswith("好的，我来回答。我很高兴为你服务")
    assert len(result.answer) < 2000  # stopped long before the 18 000 characters on offer
    assert is_looping(result.answer)
    state = await engine.store.load(SessionKey(T, S), recent=0)
    assert state.turns[-1].content == result.answer
    assert requests == 1


async def test_a_reply_past_its_deadline_stops_cleanly_with_what_arrived() -> None:
    server = StubServer(lambda r: "one two three four five six seven eight", chunk_chars=4, chunk_delay=0.3)
    with server as url:
        model = _model(url, deadline=0.8)
        engine = build_engine(store=MemoryStore(), model=model, counter=CharTokenCounter())
        result = await engine.turn(T, S, "count")
    assert model.last_finish_reason == "length"
    assert result.answer and "one two three four five six seven eight".startswith(result.answer)
    assert len(result.answer) < len("one two three four five six seven eight")


async def test_every_reply_has_a_max_tokens() -> None:
    server = StubServer()
    with server as url:
        engine = build_engine(store=MemoryStore(), model=_model(url, reply_max_tokens=77), counter=CharTokenCounter())
        await engine.turn(T, S, "hi")
        body = server.chat_requests[-1].body
    assert isinstance(body, dict) and body["max_tokens"] == 77


def test_limits_come_from_the_environment() -> None:
    from contextmode.processors.llm import LLMLimits

    settings = LLMSettings.from_env({"CONTEXTMODE_LLM_MODEL": "m", "CONTEXTMODE_LLM_REPLY_MAX_TOKENS": "300",
                                     "CONTEXTMODE_LLM_DEADLINE_S": "20", "CONTEXTMODE_LLM_RESPONSE_FORMAT": "json_object"})
    assert (settings.reply_max_tokens, settings.deadline, settings.response_format) == (300, 20.0, "json_object")
    assert LLMSettings.from_env({"CONTEXTMODE_LLM_MODEL": "m", "CONTEXTMODE_LLM_REPLY_MAX_TOKENS": "0"}).reply_max_tokens is None
    with pytest.raises(ConfigError, match="CONTEXTMODE_LLM_RESPONSE_FORMAT"):
        LLMSettings.from_env({"CONTEXTMODE_LLM_MODEL": "m", "CONTEXTMODE_LLM_RESPONSE_FORMAT": "xml"})
    assert LLMLimits.from_env({"CONTEXTMODE_LLM_CONSTRAINTS_MAX_TOKENS": "99"}).constraints == 99
    with pytest.raises(ConfigError, match="CONTEXTMODE_LLM_SUMMARY_MAX_TOKENS"):
        LLMLimits.from_env({"CONTEXTMODE_LLM_SUMMARY_MAX_TOKENS": "lots"})


def test_loop_detection_leaves_ordinary_text_alone() -> None:
    prose = " ".join(f"Sentence {i} says something new about topic {i * 7}." for i in range(60))
    assert not is_looping(prose)
    assert not is_looping("短" * 100)
    assert is_looping("哈" * 400)
    assert is_looping("Intro. " + "I am happy to help you with that. " * 8)


# -- the server's window and tokenizer ---------------------------------------------------------

def test_the_window_and_tokenizer_come_from_a_llamacpp_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONTEXTMODE_CONTEXT_WINDOW", raising=False)
    monkeypatch.delenv("CONTEXTMODE_TOKENIZER", raising=False)
    server = StubServer(llamacpp_window=2048, model="smollm2")
    with server as url:
        info = probe_server(url, "smollm2")
        assert (info.kind, info.context_window, info.window_source) == ("llamacpp", 2048, "/props n_ctx")
        model = OpenAIChatModel(model="smollm2", base_url=url, max_retries=0)
        engine = build_engine(store=MemoryStore(), model=model)
        assert engine.settings.context_window == 2048
        assert engine.counter.exact and engine.counter.name == "server:smollm2"
        assert engine.counter.count("hello world") == CharTokenCounter().count("hello world")


def test_a_budget_larger_than_the_servers_window_is_an_error_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTEXTMODE_CONTEXT_WINDOW", "8192")
    server = StubServer(llamacpp_window=4096, model="smollm2")
    with server as url:
        model = OpenAIChatModel(model="smollm2", base_url=url, max_retries=0)
        with pytest.raises(ConfigError, match=r"8192 tokens .* window is 4096 tokens \(/props n_ctx\)"):
            build_engine(store=MemoryStore(), model=model)
        monkeypatch.setenv("CONTEXTMODE_CONTEXT_WINDOW", "4096")
        assert build_engine(store=MemoryStore(), model=model).settings.context_window == 4096


def test_a_silent_server_leaves_the_configuration_alone() -> None:
    server = StubServer()  # no /props, no window in /v1/models
    with server as url:
        info = probe_server(url, "stub-model")
    assert (info.kind, info.context_window, info.tokenize_url) == ("openai", None, None)
    assert probe_server("http://127.0.0.1:9/v1", "m", timeout=0.5).context_window is None


def test_a_busy_tokenizer_falls_back_to_the_estimate_and_says_so() -> None:
    from contextmode.models.server import ServerTokenCounter

    counter = ServerTokenCounter("http://127.0.0.1:9/tokenize", fallback=CharTokenCounter(), timeout=0.2)
    assert counter.count("hello") == CharTokenCounter().count("hello")
    assert counter.exact is False  # contexts counted meanwhile report an estimate
    server = StubServer(llamacpp_window=2048)
    with server as url:
        live = ServerTokenCounter(url.removesuffix("/v1") + "/tokenize", fallback=CharTokenCounter())
        assert live.count("hello world") == CharTokenCounter().count("hello world") and live.exact
        requests = len(server.requests)
        live.count("hello world")
        assert len(server.requests) == requests  # cached


class _HalfCounter(CharTokenCounter):
    """An estimate that counts Chinese at half its size (as an estimate fitted to other tokenizers may)."""

    name = "half-chinese"

    def count(self, text: str) -> int:
        full = super().count(text)
        return full // 2 if any("\u4e00" <= ch <= "\u9fff" for ch in text) else full


def test_the_fallback_is_scaled_by_what_the_server_counted() -> None:
    from contextmode.models.server import ServerTokenCounter

    server = StubServer(llamacpp_window=2048)
    with server as url:
        counter = ServerTokenCounter(url.removesuffix("/v1") + "/tokenize", fallback=_HalfCounter(), timeout=0.5)
        assert counter.count("预算两百以内，对海鲜过敏") == 12 and counter.exact
        assert counter.count("we can spend thirty dollars per person") == 7
    assert counter.fallback_ratio("不要辣") == 2.0  # the server counted twice the estimate
    assert counter.fallback_ratio("no spicy food") == 1.0  # English was counted right
    # The server no longer answers: the estimate counts, scaled by what the server said of that kind of text.
    counter.url = "http://127.0.0.1:9/tokenize"
    assert counter.count("我们下周去杭州玩三天") == 10 and not counter.exact
    assert counter.count("three days in the mountains") == 5
    # An estimate that overcounts is not scaled down (a count too small overflows the window).
    over = ServerTokenCounter("http://127.0.0.1:9/tokenize", fallback=CharTokenCounter(), timeout=0.2)
    over._calibrate("我们下周去杭州玩三天", 5)
    assert over.fallback_ratio("我们") == 1.0
