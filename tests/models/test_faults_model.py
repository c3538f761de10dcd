"""Model faults on the reply path and in every background job, with the real openai client
against the stub server: the reply fails with a clear envelope code and keeps the user
turn; jobs retry with backoff and give up visibly; nothing already stored is touched.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest

from contextmode.types import SessionKey

pytest.importorskip("fastapi")
pytest.importorskip("openai")

from contextmode.api import build_engine
from contextmode.engine import Engine, Processors
from contextmode.jobs import JobRunner, JobSettings
from contextmode.models.openai import OpenAIChatModel
from contextmode.processors.llm import LLMConstraintExtractor, LLMEmotionScorer, LLMSummarizer
from contextmode.service import ServiceSettings, create_app
from contextmode.settings import EngineSettings
from contextmode.store import MemoryStore
from contextmode.store.base import Store
from contextmode.testing.counters import CharTokenCounter
from contextmode.testing.models import FunctionModel
from contextmode.testing.stub_server import StubRequest, StubServer
from contextmode.types import NewTurn

TENANT = "local"
SID = "faulty"
STUB_KEY = "sk-stubkey-0123456789abcdef"


def job_reply(request: StubRequest) -> str:
    """What the stub answers each background prompt with (by its system prompt)."""
    system = str(request.messages[0].get("content", "")) if request.messages else ""
    if "incremental summary" in system or "增量摘要" in system:
        return "SUMMARY: the user likes tea and hikes on Sundays."
    if "extract" in system or "提取" in system:
        return json.dumps({"upsert": [{"key": "drink", "value": "tea", "kind": "preference", "quote": "tea"}]})
    if "intensity" in system or "强度" in system:
        return '{"intensity": 0.5}'
    return f"Stub answer to: {request.last_user}"


@pytest.fixture
def stub() -> Iterator[StubServer]:
    server = StubServer(job_reply, chunk_chars=4)
    server.start()
    yield server
    server.stop()


def stub_model(stub: StubServer, *, timeout: float = 1.0) -> OpenAIChatModel:
    return OpenAIChatModel(model="stub-model", base_url=stub.url, api_key=STUB_KEY, timeout=timeout, max_retries=0)


async def snapshot(store: Store, session_id: str = SID) -> dict[str, Any]:
    """Everything stored for the session, comparable before and after a fault."""
    info = await store.info(SessionKey(TENANT, session_id))
    if info is None:
        return {"turns": [], "summary": None, "constraints": []}
    turns = await store.turns(SessionKey(TENANT, session_id), from_seq=1, to_seq=info.last_seq)
    state = await store.load(SessionKey(TENANT, session_id), recent=0, max_uncovered=0)
    return {
        "turns": [(t.seq, t.role, t.content, bool(t.metadata.get("partial"))) for t in turns],
        "summary": (state.summary.text, state.summary.covers_seq) if state.summary else None,
        "constraints": sorted((c.key, c.value) for c in state.constraints),
        "summary_version": info.summary_version,
        "constraints_version": info.constraints_version,
    }


def sse(body: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: {")]


# -- the reply path ------------------------------------------------------------------------

Inject = Callable[[StubServer], None]

# fault → how to inject it, the envelope code, and whether some answer text arrives first
REPLY_FAULTS: dict[str, tuple[Inject, int, bool]] = {
    "http_429": (lambda s: s.fail_next(429), 50202, False),
    "http_500": (lambda s: s.fail_next(500), 50202, False),
    "http_502": (lambda s: s.fail_next(502), 50202, False),
    "http_503": (lambda s: s.fail_next(503), 50202, False),
    # a 400 is retried once without stream_options (servers that refuse usage capture)
    "http_400": (lambda s: s.fail_next(400, count=2), 50201, False),
    "timeout": (lambda s: s.hang_next(seconds=5), 50401, False),
    "connection_reset": (lambda s: s.reset_next(), 50202, False),
    "truncated_stream": (lambda s: s.truncate_next(after_chunks=2), 50201, True),
    "malformed_json": (lambda s: s.malformed_next(), 50201, True),
    "no_finish_reason": (lambda s: s.unfinished_next(), 50201, True),
}


@pytest.fixture
async def reply_client(stub: StubServer) -> AsyncIterator[tuple[httpx.AsyncClient, Engine]]:
    engine = build_engine(store=MemoryStore(), model=stub_model(stub), counter=CharTokenCounter())
    app = create_app(engine, ServiceSettings())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=30) as client:
        yield client, engine
    await engine.close()


@pytest.mark.parametrize("stream", [False, True], ids=["envelope", "sse"])
@pytest.mark.parametrize("fault", list(REPLY_FAULTS))
async def test_reply_fault_keeps_the_user_turn_and_touches_nothing_else(
    reply_client: tuple[httpx.AsyncClient, Engine], stub: StubServer, fault: str, stream: bool
) -> None:
    client, engine = reply_client
    for text in ("I like tea", "and hiking on Sundays"):
        ok = await client.post(f"/v1/sessions/{SID}/messages", json={"message": text})
        assert ok.status_code == 200, ok.text
    await engine.drain()
    before = await snapshot(engine.store)
    assert len(before["turns"]) == 4

    inject, code, some_text = REPLY_FAULTS[fault]
    inject(stub)
    message = f"fault {fault} now"
    response = await client.post(f"/v1/sessions/{SID}/messages", json={"message": message, "stream": stream})
    if stream:
        assert response.status_code == 200
        events = sse(response.text)
        error = events[-1]
        assert error["type"] == "error" and error["code"] == code, events
        assert error["partial"] is some_text
        assert bool(error["partial_answer"]) is some_text  # the stored partial text reaches the client
        assert error["msg"] and STUB_KEY not in response.text
    else:
        assert response.status_code == code // 100, response.text
        body = response.json()
        assert body["code"] == code and body["msg"], body
        # The user turn is stored: the envelope says the turn was interrupted and carries any partial text.
        assert body["data"]["interrupted"] is True and bool(body["data"]["partial_answer"]) is some_text, body
        assert STUB_KEY not in response.text
    await engine.drain()

    after = await snapshot(engine.store)
    assert after["turns"][:4] == before["turns"], "turns stored before the fault changed"
    user = after["turns"][4]
    assert user[1:3] == ("user", message)
    if some_text:
        # the text that arrived is kept, marked partial (seed 000)
        assert len(after["turns"]) == 6
        _seq, role, content, partial = after["turns"][5]
        assert role == "assistant" and partial and content and f"Stub answer to: {message}".startswith(content)
    else:
        assert len(after["turns"]) == 5, "no empty answer is stored"

    # the next turn works: nothing to restart
    again = await client.post(f"/v1/sessions/{SID}/messages", json={"message": "still there?"})
    assert again.status_code == 200 and again.json()["data"]["answer"] == "Stub answer to: still there?"


async def test_openai_proxy_path_answers_model_faults_in_openai_shape(
    reply_client: tuple[httpx.AsyncClient, Engine], stub: StubServer
) -> None:
    client, engine = reply_client
    # A 429 keeps its status (the client's SDK retries it, after the endpoint's wait); a 503 is
    # the gateway's 502. The same message sent again after a failure is one stored user turn.
    for status, code, kind in ((429, 42901, "rate_limit_exceeded"), (503, 50202, "server_error")):
        stub.fail_next(status)
        response = await client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hello"}]},
            headers={"x-session-id": SID},
        )
        assert response.status_code == code // 100
        error = response.json()["error"]
        assert error["contextmode_code"] == code and error["type"] == kind
    await engine.drain()
    assert [t[1] for t in (await snapshot(engine.store))["turns"]] == ["user"]


# -- background jobs -----------------------------------------------------------------------


class Sleeps:
    """Records the backoffs instead of waiting for them."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


def jobs_engine(stub: StubServer, sleeps: Sleeps, *, attempts: int = 3) -> Engine:
    """The answer from a local fake; summary, constraints and emotion from the stub (LLM processors)."""
    store = MemoryStore()
    model = stub_model(stub)
    settings = EngineSettings(summary_threshold=2, job_attempts=attempts, strategy="default")
    runner = JobRunner(store, replace(JobSettings(), attempts=attempts, base_delay_s=0.5, jitter=0.0), sleep=sleeps)
    return build_engine(
        store=store,
        model=FunctionModel(lambda messages: "fine"),
        counter=CharTokenCounter(),
        settings=settings,
        processors=replace(
            Processors.offline(),
            summarizer=LLMSummarizer(model),
            extractor=LLMConstraintExtractor(model),
            emotion=LLMEmotionScorer(model),
        ),
        jobs=runner,
    )


async def seed_history(engine: Engine, turns: int = 10) -> None:
    await engine.store.append(
        SessionKey(TENANT, SID),
        [NewTurn(role="user" if i % 2 == 0 else "assistant", content=f"old turn {i}", tokens=3) for i in range(turns)],
    )


JOB_FAULTS: dict[str, Inject] = {
    "http_429": lambda s: s.fail_next(429, count=9),
    "http_500": lambda s: s.fail_next(500, count=9),
    "http_503": lambda s: s.fail_next(503, count=9),
    "timeout": lambda s: s.hang_next(count=9, seconds=5),
    "connection_reset": lambda s: s.reset_next(count=9),
    "truncated_body": lambda s: s.truncate_next(count=9),
    "malformed_json": lambda s: s.malformed_next(count=9),
}


@pytest.mark.parametrize("fault", list(JOB_FAULTS))
async def test_background_jobs_retry_with_backoff_then_give_up_visibly(stub: StubServer, fault: str) -> None:
    sleeps = Sleeps()
    engine = jobs_engine(stub, sleeps)
    if fault == "timeout":
        engine.summarizer = LLMSummarizer(stub_model(stub, timeout=0.3))
        engine.extractor = LLMConstraintExtractor(stub_model(stub, timeout=0.3))
        engine.emotion = LLMEmotionScorer(stub_model(stub, timeout=0.3))
    await seed_history(engine)
    # a clean turn first: a summary, a constraint and emotion scores are stored
    first = await engine.turn(TENANT, SID, "I like tea")
    assert set(first.jobs) == {"emotion", "constraints", "summary"}
    await engine.drain()
    before = await snapshot(engine.store)
    assert before["summary"] is not None and before["constraints"] == [("drink", "tea")]
    first_info = await engine.store.info(SessionKey(TENANT, SID))
    assert first_info is not None
    stats = first_info.jobs
    assert {name: (s.ok, s.failed) for name, s in stats.items()} == {
        "emotion": (1, 0), "constraints": (1, 0), "summary": (1, 0)
    }
    stub.reset()

    # every attempt of the next turn's unit hits the fault (3 steps x 3 attempts)
    JOB_FAULTS[fault](stub)
    result = await engine.turn(TENANT, SID, "and coffee too, lots of it")
    assert result.answer == "fine" and not result.partial  # the reply never waits for the jobs
    assert set(result.jobs) == {"emotion", "constraints", "summary"}
    await engine.drain()

    assert len(stub.chat_requests) == 9, "three attempts of the unit, each asking for the three steps"
    info = await engine.store.info(SessionKey(TENANT, SID))
    assert info is not None
    for name in ("emotion", "constraints", "summary"):
        job = info.jobs[name]
        assert (job.ok, job.failed) == (1, 1), (name, job)
        assert job.last_error and job.last_error.startswith("after 3 attempts:"), job.last_error
        assert STUB_KEY not in job.last_error
    # exponential backoff between the attempts of the session's one unit: 0.5 s then 1 s
    assert sleeps.delays == [0.5, 1.0]

    after = await snapshot(engine.store)
    assert after["summary"] == before["summary"] and after["constraints"] == before["constraints"]
    assert after["summary_version"] == before["summary_version"]
    assert after["constraints_version"] == before["constraints_version"]
    assert after["turns"][: len(before["turns"])] == before["turns"]
    assert [t[2] for t in after["turns"][len(before["turns"]):]] == ["and coffee too, lots of it", "fine"]
    await engine.close()


async def test_a_job_that_fails_once_succeeds_on_retry(stub: StubServer) -> None:
    sleeps = Sleeps()
    engine = jobs_engine(stub, sleeps)
    stub.fail_next(503)  # the unit's first attempt: its emotion step
    stub.malformed_next()  # ...and its constraints step
    await engine.turn(TENANT, SID, "I like tea")
    await engine.drain()
    info = await engine.store.info(SessionKey(TENANT, SID))
    assert info is not None
    assert (info.jobs["emotion"].ok, info.jobs["emotion"].failed) == (1, 0)
    assert (info.jobs["constraints"].ok, info.jobs["constraints"].failed) == (1, 0)
    assert sleeps.delays == [0.5]  # one retry of the unit covers both steps
    assert (await snapshot(engine.store))["constraints"] == [("drink", "tea")]
    await engine.close()


async def test_job_failures_show_in_the_session_stats_over_http(stub: StubServer) -> None:
    sleeps = Sleeps()
    engine = jobs_engine(stub, sleeps, attempts=2)
    app = create_app(engine, ServiceSettings())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        stub.fail_next(429, count=4)  # emotion and constraints, two attempts each
        response = await client.post(f"/v1/sessions/{SID}/messages", json={"message": "I like tea"})
        assert response.status_code == 200
        await engine.drain()
        session = (await client.get(f"/v1/sessions/{SID}")).json()["data"]
    jobs = session["stats"]["jobs"]
    assert jobs["emotion"]["failed"] == 1 and jobs["constraints"]["failed"] == 1
    assert "after 2 attempts" in jobs["emotion"]["last_error"] and "429" in jobs["emotion"]["last_error"]
    assert [t["content"] for t in session["turns"]] == ["I like tea", "fine"]
    assert session["constraints"] == []
    await engine.close()


@pytest.mark.parametrize("fault", ["http_429", "http_503", "connection_reset", "malformed_json", "timeout"])
async def test_detector_and_rewriter_faults_do_not_fail_the_reply(stub: StubServer, fault: str) -> None:
    """The LLM detector and rewriter sit on the response path: a failing model makes them
    fall back to the offline ones, and the turn is answered and stored as usual."""
    from contextmode.processors.detect import OfflineContextDetector
    from contextmode.processors.llm import LLMContextDetector, LLMRewriter
    from contextmode.processors.rewrite import OfflineRewriter

    model = stub_model(stub, timeout=0.3)
    engine = build_engine(
        store=MemoryStore(),
        model=FunctionModel(lambda messages: "fine"),
        counter=CharTokenCounter(),
        processors=replace(
            Processors.offline(),
            detector=LLMContextDetector(model, fallback=OfflineContextDetector()),
            rewriter=LLMRewriter(model, fallback=OfflineRewriter()),
        ),
    )
    await engine.turn(TENANT, SID, "我想买一台笔记本电脑，预算五千")
    await engine.drain()
    before = await snapshot(engine.store)
    stub.reset()
    inject = {
        "http_429": lambda: stub.fail_next(429, count=2),
        "http_503": lambda: stub.fail_next(503, count=2),
        "connection_reset": lambda: stub.reset_next(count=2),
        "malformed_json": lambda: stub.malformed_next(count=2),
        "timeout": lambda: stub.hang_next(count=2, seconds=3),
    }[fault]
    inject()
    result = await engine.turn(TENANT, SID, "那它的续航怎么样？")
    assert result.answer == "fine" and not result.partial
    assert result.prepared.detection.reason  # decided by the fallback when the model failed
    await engine.drain()
    after = await snapshot(engine.store)
    assert after["turns"][: len(before["turns"])] == before["turns"]
    assert [t[2] for t in after["turns"][len(before["turns"]):]] == ["那它的续航怎么样？", "fine"]
    await engine.close()
