"""The HTTP service in process (httpx ASGITransport): envelope, codes, sessions, context, auth, metrics, OpenAPI.

The helpers at the top (`make_engine`, `make_app`, `SlowModel`, `sse_events`) are
imported by the other ``test_service_*`` files.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from contextmode.types import SessionKey

pytest.importorskip("fastapi")

from contextmode import errors
from contextmode.engine import Engine, Processors
from contextmode.errors import ModelError, ModelTimeout, ModelUnavailable, StoreError
from contextmode.processors.base import ConstraintUpdate
from contextmode.service import ServiceSettings, create_app
from contextmode.service.codes import CODE_TABLE, code_for_exception, http_status
from contextmode.settings import EngineSettings
from contextmode.store import MemoryStore
from contextmode.testing import CharTokenCounter
from contextmode.testing.models import BrokenStream, FunctionModel, ScriptedModel
from contextmode.testing.processors import (
    FlatEmotion,
    JoiningSummarizer,
    KeywordDetector,
    PrefixRewriter,
    SpiceExtractor,
)
from contextmode.types import ChatMessage, Constraint, Turn

# -- helpers shared with the other service tests ------------------------------------------


class SlowModel:
    """Streams ``chunks`` with ``delay_s`` seconds before each (a real, incremental stream)."""

    def __init__(self, chunks: Sequence[str], delay_s: float = 0.0, name: str = "slow-model") -> None:
        self.chunks, self.delay_s, self.name = list(chunks), delay_s, name
        self.calls: list[Sequence[ChatMessage]] = []

    async def stream(self, messages: Sequence[ChatMessage], *, max_tokens: int | None = None) -> AsyncIterator[str]:
        self.calls.append(list(messages))
        for chunk in self.chunks:
            await asyncio.sleep(self.delay_s)
            yield chunk

    async def complete(self, messages: Sequence[ChatMessage], *, max_tokens: int | None = None) -> str:
        return "".join([c async for c in self.stream(messages)])


def echo(messages: Sequence[ChatMessage]) -> list[str]:
    return ["收到：", messages[-1].content[:12]]


def make_engine(model: Any = None, *, store: Any = None, summarizer: Any = None, **settings: Any) -> Engine:
    return Engine(
        store=store or MemoryStore(),
        model=model or FunctionModel(echo),
        counter=CharTokenCounter(),
        processors=Processors(
            detector=KeywordDetector(reason="keyword"),
            rewriter=PrefixRewriter(),
            summarizer=summarizer or JoiningSummarizer(),
            extractor=SpiceExtractor(),
            emotion=FlatEmotion(),
        ),
        settings=EngineSettings(**settings),
    )


def make_settings(tmp_path: Path, **overrides: Any) -> ServiceSettings:
    return ServiceSettings(image_dir=tmp_path / "images", **overrides)


def client_for(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def sse_events(text: str) -> list[Any]:
    """The ``data:`` payloads of an SSE body, JSON-decoded, ``[DONE]`` kept as a string."""
    out: list[Any] = []
    for block in text.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                data = line[len("data: ") :]
                out.append(data if data == "[DONE]" else json.loads(data))
    return out


@pytest.fixture
def engine() -> Engine:
    return make_engine()


@pytest.fixture
def app(engine: Engine, tmp_path: Path) -> Any:
    return create_app(engine, make_settings(tmp_path))


@pytest.fixture
async def client(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(app) as c:
        yield c


def assert_error(response: httpx.Response, code: int) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"code", "msg", "data"}, body
    assert body["code"] == code, body
    assert response.status_code == code // 100
    assert body["msg"]
    return body


# -- chat turns -------------------------------------------------------------------------------


async def test_message_returns_envelope_with_answer_and_accounting(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/sessions/s1/messages", json={"message": "我不吃辣"})
    assert r.status_code == 200
    assert float(r.headers["server-timing"].removeprefix("app;dur=")) > 0
    body = r.json()
    assert body["code"] == 0 and body["msg"] == "success"
    data = body["data"]
    assert data["answer"] == "收到：我不吃辣"
    assert (data["partial"], data["user_seq"], data["seq"]) == (False, 1, 2)
    layers = {layer["name"]: layer for layer in data["context"]["layers"]}
    assert {"allocated", "used", "dropped_seqs"} <= set(next(iter(layers.values())))
    assert data["context"]["total_tokens"] > 0


async def test_stream_emits_context_deltas_done_and_stores_turns(client: httpx.AsyncClient, engine: Engine) -> None:
    r = await client.post("/v1/sessions/s1/messages", json={"message": "你好", "stream": True})
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    kinds = [e if isinstance(e, str) else e["type"] for e in events]
    # Deltas that arrive together are sent as one (coalesced), so count is not fixed.
    assert kinds[0] == "context" and kinds[-2:] == ["done", "[DONE]"] and set(kinds[1:-2]) == {"delta"}
    assert events[0]["session_id"] == "s1" and events[0]["layers"]
    assert "".join(e["text"] for e in events if isinstance(e, dict) and e["type"] == "delta") == "收到：你好"
    assert events[-2] == events[-2] | {"answer": "收到：你好", "partial": False, "seq": 2, "user_seq": 1}
    stored = await engine.store.turns(SessionKey("local", "s1"))
    assert [t.content for t in stored] == ["你好", "收到：你好"]


async def test_model_failure_mid_stream_is_an_error_event_and_partial_answer_is_kept(tmp_path: Path) -> None:
    engine = make_engine(ScriptedModel([BrokenStream(chunks=["一半"])]))
    async with client_for(create_app(engine, make_settings(tmp_path))) as c:
        r = await c.post("/v1/sessions/s1/messages", json={"message": "讲个故事", "stream": True})
        events = sse_events(r.text)
        assert [e if isinstance(e, str) else e["type"] for e in events] == ["context", "delta", "error", "[DONE]"]
        assert events[2]["code"] == 50201
        session = (await c.get("/v1/sessions/s1")).json()["data"]
        assert [(t["content"], t["partial"]) for t in session["turns"]] == [("讲个故事", False), ("一半", True)]
        assert session["last_answer"] == "一半"


@pytest.mark.parametrize(
    ("error", "code"),
    [(ModelError("bad output"), 50201), (ModelUnavailable("503"), 50202), (ModelTimeout("slow"), 50401)],
)
async def test_model_errors_map_to_envelope_codes(tmp_path: Path, error: Exception, code: int) -> None:
    engine = make_engine(ScriptedModel([error]))
    async with client_for(create_app(engine, make_settings(tmp_path))) as c:
        assert_error(await c.post("/v1/sessions/s1/messages", json={"message": "在吗"}), code)
        # the user turn was stored before the model was called
        assert (await c.get("/v1/sessions/s1")).json()["data"]["last_seq"] == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_follow_up_without_previous_answer_is_42201_envelope(client: httpx.AsyncClient, engine: Engine, stream: bool) -> None:
    await engine.store.append(SessionKey("local", "s1"), [_user_turn("什么是熵")])
    r = await client.post("/v1/sessions/s1/messages", json={"message": "举个例子", "stream": stream})
    body = assert_error(r, 42201)
    assert "当前没有可用的上文信息" in body["msg"]


def _user_turn(text: str) -> Any:
    from contextmode.types import NewTurn

    return NewTurn(role="user", content=text, tokens=len(text))


async def test_decoupled_mode_hides_history_from_the_answer(tmp_path: Path) -> None:
    model = FunctionModel(echo)
    async with client_for(create_app(make_engine(model), make_settings(tmp_path))) as c:
        await c.post("/v1/sessions/s1/messages", json={"message": "空调制冷差"})
        await c.post("/v1/sessions/s1/messages", json={"message": "那个按钮在哪", "mode": "decoupled"})
    sent = model.calls[-1].messages
    assert all("空调制冷差" not in m.content or "（空调制冷差）" in m.content for m in sent)
    assert "那个按钮在哪（空调制冷差）" in model.calls[-1].last_user


# -- sessions ---------------------------------------------------------------------------------


async def test_session_history_paginates_and_shows_summary_constraints_stats(client: httpx.AsyncClient, engine: Engine) -> None:
    for text in ["我不吃辣", "推荐一家店", "再来一家"]:
        assert (await client.post("/v1/sessions/s1/messages", json={"message": text})).json()["code"] == 0
    await engine.drain()
    page = (await client.get("/v1/sessions/s1", params={"limit": 4})).json()["data"]
    assert page["last_seq"] == 6
    assert [t["seq"] for t in page["turns"]] == [3, 4, 5, 6]
    assert page["next_before"] == 3
    older = (await client.get("/v1/sessions/s1", params={"limit": 4, "before": 3})).json()["data"]
    assert [t["seq"] for t in older["turns"]] == [1, 2]
    assert older["next_before"] is None
    assert page["constraints"] == [
        {"key": "spice", "value": "不吃辣", "kind": "constraint", "source_seq": 1, "quote": ""}
    ]
    assert page["stats"]["jobs"]["constraints"]["ok"] >= 1
    assert page["stats"]["pending_jobs"] == []
    assert page["turns"][-1]["metadata"]["reply_to"] == 5


async def test_summary_is_shown_once_committed(tmp_path: Path) -> None:
    engine = make_engine(summary_threshold=2, strategy="sliding_summary")
    async with client_for(create_app(engine, make_settings(tmp_path))) as c:
        for i in range(8):
            await c.post("/v1/sessions/s1/messages", json={"message": f"第{i}个问题"})
        await engine.drain()
        data = (await c.get("/v1/sessions/s1")).json()["data"]
    assert data["summary"] is not None and data["summary"]["covers_seq"] >= 1
    assert "第0个问题" in data["summary"]["text"]


async def test_list_and_delete_sessions(client: httpx.AsyncClient) -> None:
    for sid in ["a", "b"]:
        await client.post(f"/v1/sessions/{sid}/messages", json={"message": "hi"})
    listed = (await client.get("/v1/sessions")).json()["data"]
    assert sorted(s["session_id"] for s in listed["sessions"]) == ["a", "b"]
    r = await client.delete("/v1/sessions/a")
    data = r.json()["data"]
    assert (data["session_id"], data["deleted"]) == ("a", True)
    assert data["counts"]["sessions"] == 1 and data["counts"]["turns"] == 2
    assert_error(await client.get("/v1/sessions/a"), 40401)
    assert_error(await client.delete("/v1/sessions/a"), 40401)
    assert [s["session_id"] for s in (await client.get("/v1/sessions")).json()["data"]["sessions"]] == ["b"]


async def test_context_preview_writes_nothing_and_shows_detection_and_rewrite(client: httpx.AsyncClient, engine: Engine) -> None:
    await client.post("/v1/sessions/s1/messages", json={"message": "空调制冷差"})
    await engine.drain()
    before = await engine.store.version(SessionKey("local", "s1"))
    r = await client.get("/v1/sessions/s1/context", params={"message": "那个按钮在哪"})
    data = r.json()["data"]
    assert await engine.store.version(SessionKey("local", "s1")) == before
    assert data["detection"]["intent"] == "pronoun" and data["detection"]["needs_context"]
    assert data["rewrite"] == {"text": "那个按钮在哪（空调制冷差）", "changed": True, "source": "test"}
    # Contextual mode: the message goes verbatim; the verified rewrite is only a hint.
    assert data["message"] == "那个按钮在哪"
    recent = next(layer for layer in data["layers"] if layer["name"] == "recent")
    assert recent["used"] > 0 and recent["allocated"] >= recent["used"]
    assert [item["seq"] for item in recent["content"]] == [1, 2]
    assert data["messages"][-1]["role"] == "user"
    assert sum(layer["used"] for layer in data["layers"]) <= data["total_tokens"]


# -- envelope on every error ------------------------------------------------------------------


async def test_validation_errors_use_the_envelope(client: httpx.AsyncClient) -> None:
    url = "/v1/sessions/s1/messages"
    bad_json = await client.post(url, content=b"{not json", headers={"content-type": "application/json"})
    assert assert_error(bad_json, 40001)["msg"] == "invalid JSON body"
    assert "message" in assert_error(await client.post(url, json={}), 40001)["msg"]
    assert_error(await client.post(url, json={"message": "hi", "unknown": 1}), 40001)
    assert_error(await client.post(url, json={"message": "hi", "mode": "telepathic"}), 40001)
    assert_error(await client.post(url, json={"message": ""}), 40005)  # empty: its own code
    assert_error(await client.get("/v1/sessions/s1", params={"limit": 0}), 40001)
    assert_error(await client.get("/v1/sessions/s1/context"), 40001)
    assert_error(await client.get("/nowhere"), 40400)
    assert_error(await client.put(url, json={"message": "hi"}), 40500)


async def test_invalid_session_id_and_oversized_inputs(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, max_message_chars=10, max_body_bytes=2048)
    async with client_for(create_app(make_engine(), settings)) as c:
        assert_error(await c.post("/v1/sessions/bad id!/messages", json={"message": "hi"}), 40004)
        assert_error(await c.get("/v1/sessions/" + "x" * 200), 40004)
        assert_error(await c.post("/v1/sessions/s1/messages", json={"message": "字" * 11}), 40002)
        assert_error(await c.get("/v1/sessions/s1/context", params={"message": "字" * 11}), 40002)
        assert_error(await c.post("/v1/sessions/s1/messages", json={"message": "x" * 4000}), 41301)

        async def chunked() -> AsyncIterator[bytes]:
            yield b'{"message": "'
            for _ in range(10):
                yield b"x" * 512
            yield b'"}'

        r = await c.post("/v1/sessions/s1/messages", content=chunked(), headers={"content-type": "application/json"})
        assert_error(r, 41301)


async def test_store_failures_and_bugs_are_envelopes(tmp_path: Path) -> None:
    class BrokenStore(MemoryStore):
        async def info(self, key: SessionKey) -> Any:
            raise StoreError("database is locked")

        async def list_sessions(self, tenant: str, *, limit: int = 100, offset: int = 0) -> Any:
            raise RuntimeError("a bug")

    async with client_for(create_app(make_engine(store=BrokenStore()), make_settings(tmp_path))) as c:
        assert_error(await c.get("/v1/sessions/s1"), 50301)
        body = assert_error(await c.get("/v1/sessions"), 50000)
        assert body["msg"] == "internal error"


def test_every_library_error_has_exactly_one_code() -> None:
    for name in errors.__all__:
        cls = getattr(errors, name)
        row = code_for_exception(cls.__new__(cls))
        assert row.code >= 40000, name
        assert http_status(row.code) == row.code // 100
    assert code_for_exception(errors.NoPreviousAnswer("example")).code == 42201
    assert code_for_exception(errors.MessageTooLarge(10, 5)).code == 40002
    assert code_for_exception(ValueError()).code == 50000
    codes = [row.code for row in CODE_TABLE]
    assert codes == sorted(set(codes))


# -- auth -------------------------------------------------------------------------------------


async def test_api_keys_scope_sessions_to_tenants(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, api_keys={"key-a": "tenantA", "key-b": "tenantB"})
    engine = make_engine()
    async with client_for(create_app(engine, settings)) as c:
        r = await c.post("/v1/sessions/s1/messages", json={"message": "hi"})
        assert_error(r, 40101)
        assert r.headers["www-authenticate"] == "Bearer"
        assert_error(await c.get("/v1/sessions", headers={"Authorization": "Bearer nope"}), 40101)
        a = {"Authorization": "Bearer key-a"}
        b = {"X-API-Key": "key-b"}
        assert (await c.post("/v1/sessions/s1/messages", json={"message": "hi"}, headers=a)).json()["code"] == 0
        assert_error(await c.get("/v1/sessions/s1", headers=b), 40401)
        assert (await c.get("/v1/sessions", headers=b)).json()["data"]["sessions"] == []
        assert [s["session_id"] for s in (await c.get("/v1/sessions", headers=a)).json()["data"]["sessions"]] == ["s1"]
        assert_error(await c.delete("/v1/sessions/s1", headers=b), 40401)
        assert (await c.get("/healthz")).json()["code"] == 0  # ops endpoints need no key
    assert await engine.store.info(SessionKey("tenantA", "s1")) is not None


def test_settings_from_env_and_key_files(tmp_path: Path) -> None:
    keys_json = tmp_path / "keys.json"
    keys_json.write_text(json.dumps({"keys": {"j1": "tj"}}))
    keys_toml = tmp_path / "keys.toml"
    keys_toml.write_text('[keys]\nt1 = "tt"\n')
    s = ServiceSettings.from_env(
        {
            "CONTEXTMODE_API_KEYS": "k1:tenantA, k2:tenantB",
            "CONTEXTMODE_API_KEYS_FILE": str(keys_json),
            "CONTEXTMODE_MAX_IMAGES": "2",
            "CONTEXTMODE_ALLOWED_IMAGE_TYPES": "png,jpg",
        }
    )
    assert dict(s.api_keys) == {"j1": "tj", "k1": "tenantA", "k2": "tenantB"}
    assert (s.host, s.port, s.max_images, s.allowed_image_types) == ("127.0.0.1", 8000, 2, ("png", "jpeg"))
    assert "k1" not in repr(s) and "j1" not in repr(s)
    assert dict(ServiceSettings.from_env({"CONTEXTMODE_API_KEYS_FILE": str(keys_toml)}).api_keys) == {"t1": "tt"}
    with pytest.raises(errors.ConfigError) as info:
        ServiceSettings.from_env({"CONTEXTMODE_API_KEYS": "secret-without-tenant"})
    assert "secret-without-tenant" not in str(info.value)
    with pytest.raises(errors.ConfigError):
        ServiceSettings.from_env({"CONTEXTMODE_MAX_IMAGES": "many"})


# -- ops --------------------------------------------------------------------------------------


async def test_healthz_checks_the_store(client: httpx.AsyncClient, tmp_path: Path) -> None:
    r = await client.get("/healthz")
    assert r.json() == {"code": 0, "msg": "success", "data": {"status": "ok", "store": "MemoryStore", "model": "function-model"}}

    class DownStore(MemoryStore):
        async def version(self, key: SessionKey) -> Any:
            raise StoreError("connection refused")

    async with client_for(create_app(make_engine(store=DownStore()), make_settings(tmp_path))) as c:
        assert_error(await c.get("/healthz"), 50301)


async def test_metrics_count_turns_tokens_jobs_and_requests(tmp_path: Path) -> None:
    engine = make_engine(ScriptedModel(["好的", ModelError("down")]))
    async with client_for(create_app(engine, make_settings(tmp_path))) as c:
        await c.post("/v1/sessions/s1/messages", json={"message": "我不吃辣"})
        await c.post("/v1/sessions/s1/messages", json={"message": "再说"})
        await engine.drain()
        text = (await c.get("/metrics")).text
    assert 'contextmode_turns_total{mode="contextual",outcome="ok"} 1.0' in text
    assert 'contextmode_turns_total{mode="contextual",outcome="error"} 1.0' in text
    assert 'contextmode_layer_tokens_count{layer="current"} 1.0' in text
    # One unit of background work per session: the second turn's joins the first's, or a new one.
    assert re.search(r'contextmode_jobs_scheduled_total\{job="memory"\} [12]\.0', text), text
    assert "contextmode_ttft_seconds_count 1.0" in text
    assert "contextmode_active_streams 0.0" in text
    assert 'contextmode_http_requests_total{method="POST",route="/v1/sessions/{session_id}/messages",status="200"} 1.0' in text
    assert 'status="502"' in text


async def test_job_failures_are_counted(tmp_path: Path) -> None:
    class FailingExtractor:
        async def extract(self, turn: Turn, current: Sequence[Constraint]) -> ConstraintUpdate:
            raise RuntimeError("extractor down")

    engine = make_engine()
    engine.extractor = FailingExtractor()
    engine.jobs.settings = type(engine.jobs.settings)(attempts=2, base_delay_s=0)
    async with client_for(create_app(engine, make_settings(tmp_path))) as c:
        await c.post("/v1/sessions/s1/messages", json={"message": "hi"})
        await engine.drain()
        text = (await c.get("/metrics")).text
        stats = (await c.get("/v1/sessions/s1")).json()["data"]["stats"]["jobs"]
    assert 'contextmode_job_failures_total{job="constraints"} 2.0' in text
    assert stats["constraints"]["failed"] == 1


async def test_openapi_schema_lists_routes_and_envelopes(client: httpx.AsyncClient) -> None:
    schema = (await client.get("/openapi.json")).json()
    paths = schema["paths"]
    assert set(paths) >= {
        "/v1/sessions/{session_id}/messages",
        "/v1/sessions/{session_id}",
        "/v1/sessions/{session_id}/context",
        "/v1/sessions",
        "/v1/chat/completions",
        "/healthz",
        "/metrics",
    }
    assert set(paths["/v1/sessions/{session_id}"]) == {"get", "delete"}
    post = paths["/v1/sessions/{session_id}/messages"]["post"]
    assert "text/event-stream" in post["responses"]["200"]["content"]
    assert {"400", "401", "404", "422", "502", "504"} <= set(post["responses"])
    components = schema["components"]["schemas"]
    assert {"MessageRequest", "ErrorEnvelope", "ContextOut", "TurnOut"} <= set(components)
    assert set(components["MessageRequest"]["properties"]) == {"message", "images", "stream", "mode", "user_id"}
    assert "bearer" in json.dumps(schema["components"].get("securitySchemes", {})).lower()


async def test_offline_by_default_without_an_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("CONTEXTMODE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("CONTEXTMODE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CONTEXTMODE_IMAGE_DIR", str(tmp_path / "images"))
    app = create_app()
    state = app.state.contextmode
    assert state.owns_engine and state.settings.host == "127.0.0.1" and not state.settings.auth_enabled
    async with app.router.lifespan_context(app), client_for(app) as c:
        r = await c.post("/v1/sessions/s1/messages", json={"message": "我不吃辣，预算五十以内"})
        data = r.json()["data"]
        assert r.json()["code"] == 0 and data["answer"]  # the offline responder answered
        assert (await c.get("/healthz")).json()["data"]["store"] == "SQLiteStore"
        assert (await c.get("/v1/sessions/s1")).json()["data"]["last_seq"] == 2
    assert (tmp_path / "home").exists()


async def test_request_log_has_no_secrets_or_message_text(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(make_engine(), make_settings(tmp_path, api_keys={"sk-very-secret-key": "t1"}))
    with caplog.at_level("INFO", logger="contextmode"):
        async with client_for(app) as c:
            headers = {"Authorization": "Bearer sk-very-secret-key"}
            await c.post("/v1/sessions/s1/messages", json={"message": "我的密码是 hunter2"}, headers=headers)
            await c.get("/v1/sessions/s1/context", params={"message": "hunter2 again"}, headers=headers)
            await c.get("/v1/sessions", headers={"Authorization": "Bearer sk-wrong-secret-key"})
    lines = [r for r in caplog.records if r.name == "contextmode.http"]
    assert len(lines) == 3
    assert "POST /v1/sessions/s1/messages 200" in lines[0].getMessage() and "tenant=t1" in lines[0].getMessage()
    assert "401" in lines[2].getMessage()
    text = "\n".join(r.getMessage() + repr(r.__dict__) for r in caplog.records)
    assert "secret" not in text and "hunter2" not in text


def test_service_modules_have_complete_all() -> None:
    # ruff's RUF022 keeps each __all__ sorted
    import importlib
    import pkgutil

    import contextmode.service as package

    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"contextmode.service.{info.name}")
        names = module.__all__
        assert len(names) == len(set(names)), info.name
        assert all(hasattr(module, name) for name in names), info.name


async def test_responses_match_their_declared_models(client: httpx.AsyncClient, engine: Engine) -> None:
    from contextmode.service.schemas import (
        ContextOut,
        DeletedOut,
        Envelope,
        ErrorEnvelope,
        HealthOut,
        SessionListOut,
        SessionOut,
        TurnOut,
    )

    Envelope[TurnOut].model_validate((await client.post("/v1/sessions/s1/messages", json={"message": "我不吃辣"})).json())
    await engine.drain()
    Envelope[SessionOut].model_validate((await client.get("/v1/sessions/s1")).json())
    Envelope[ContextOut].model_validate((await client.get("/v1/sessions/s1/context", params={"message": "那个呢"})).json())
    Envelope[SessionListOut].model_validate((await client.get("/v1/sessions")).json())
    Envelope[HealthOut].model_validate((await client.get("/healthz")).json())
    Envelope[DeletedOut].model_validate((await client.delete("/v1/sessions/s1")).json())
    ErrorEnvelope.model_validate((await client.get("/v1/sessions/s1")).json())
