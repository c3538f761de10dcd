"""Lifecycle: the store contract on every backend, resumable forget, retention, export/import round trips."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from contextmode.api import build_engine
from contextmode.cli.app import app as cli_app
from contextmode.errors import ConfigError, InputError, InvalidSessionId
from contextmode.lifecycle import (
    export_records,
    forget,
    import_records,
    lifecycle_store,
    migrate,
    read_export,
    resume_forgets,
    store_digest,
    write_export,
)
from contextmode.lifecycle.retention import RetentionPolicy, RetentionSettings, enforce_retention
from contextmode.settings import EngineSettings
from contextmode.store import MemoryStore, SQLiteStore, open_store
from contextmode.store.base import Store
from contextmode.testing.backends import Backend, fresh_store_url
from contextmode.testing.contract import new_turns
from contextmode.testing.contract_lifecycle import LifecycleContract
from contextmode.types import NewTurn, SessionKey


class TestMemoryLifecycle(LifecycleContract):
    @pytest.fixture
    async def store(self) -> MemoryStore:
        return MemoryStore()


class TestSQLiteLifecycle(LifecycleContract):
    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[Store]:
        async with SQLiteStore(tmp_path / "l.db") as store:
            yield store


@pytest.mark.postgres
class TestPostgresLifecycle(LifecycleContract):
    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[Store]:
        async with fresh_store_url("postgres", tmp_path) as url:
            store = open_store(url)
            yield store
            await store.close()


@pytest.mark.redis
class TestRedisLifecycle(LifecycleContract):
    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[Store]:
        async with fresh_store_url("redis", tmp_path) as url:
            store = open_store(url)
            yield store
            await store.close()


# -- forget -------------------------------------------------------------------------


async def test_forget_resumes_after_a_crash_without_double_counting() -> None:
    store = MemoryStore()
    for sid in ("a", "b", "c"):
        await store.append(SessionKey("t", sid), new_turns(2), user_id="u")
    await store.append(SessionKey("t", "other"), new_turns(2), user_id="v")
    # A forget that erased one session, then died.
    record = await store.open_deletion("t", "user", "u", actor="test")
    await store.erase_session(SessionKey("t", "a"), record_id=record.id)
    assert (await store.deletions(pending_only=True))[0].id == record.id
    [done] = await resume_forgets(store)
    assert done.id == record.id and not done.pending
    assert done.counts["sessions"] == 3 and done.counts["turns"] == 6
    assert [i.session_id for i in await store.list_sessions("t")] == ["other"]
    assert await resume_forgets(store) == []


async def test_forget_validates_before_touching_anything() -> None:
    store = MemoryStore()
    await store.append(SessionKey("t", "s"), new_turns(1), user_id="u")
    with pytest.raises(ConfigError):
        await forget(store, "t", "everything", "u")  # type: ignore[arg-type]
    with pytest.raises(InvalidSessionId):
        await forget(store, "t", "user", "../etc")
    assert await store.deletions() == []
    record = await forget(store, "t", "tenant", "ignored")
    assert record.target == "t" and record.counts["sessions"] == 1


async def test_library_forget_user() -> None:
    from contextmode import ContextMode

    cm = ContextMode(store="memory://")
    try:
        cm.chat("s1", "我叫小王，预算五十", user_id="wang")
        cm.chat("s2", "还是我", user_id="wang")
        cm.chat("s3", "别人", user_id="li")
        cm.drain()
        record = cm.forget(user_id="wang")
        assert record.counts["sessions"] == 2 and record.counts["turns"] == 4
        with pytest.raises(ConfigError):
            cm.forget()
    finally:
        cm.close()


# -- retention ----------------------------------------------------------------------


async def test_retention_applies_each_limit_and_is_off_by_default() -> None:
    assert not RetentionSettings.from_env({}).enabled
    store = MemoryStore()
    now = datetime.now(UTC)
    for k in range(4):
        await store.append(SessionKey("t", f"u-{k}"), new_turns(2), user_id="u")
    await store.append(SessionKey("t", "long"), new_turns(30), user_id="v")
    await store.append(SessionKey("t", "old"), new_turns(2))
    await store.restore_session(SessionKey("t", "old"), user_id=None, created_at=now - timedelta(days=40),
                                updated_at=now - timedelta(days=40))
    await store.append(SessionKey("keep", "old"), new_turns(2))
    await store.restore_session(SessionKey("keep", "old"), user_id=None, created_at=now - timedelta(days=40),
                                updated_at=now - timedelta(days=40))
    settings = RetentionSettings(
        default=RetentionPolicy(),
        tenants={"t": RetentionPolicy(max_age_days=30, max_turns=10, max_sessions_per_user=2)},
    )
    counts = await enforce_retention(store, settings, now=now)
    assert counts["sessions"] == 3  # "old" and u's two oldest
    assert counts["turns"] == 2 + 4 + 20
    left = {i.session_id: i.last_seq for i in await store.list_sessions("t")}
    assert set(left) == {"u-3", "u-2", "long"}
    assert [t.seq for t in await store.turns(SessionKey("t", "long"))] == list(range(21, 31))
    assert await store.info(SessionKey("keep", "old")) is not None  # no policy for that tenant
    assert (await enforce_retention(store, settings, now=now)).get("turns", 0) == 0
    records = await store.deletions()
    assert [r.scope for r in records] == ["retention", "retention"]


def test_retention_settings_from_env_and_file(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"acme": {"max_turns": 100}}))
    settings = RetentionSettings.from_env({"CONTEXTMODE_RETENTION_MAX_AGE_DAYS": "30",
                                           "CONTEXTMODE_RETENTION_FILE": str(path)})
    assert settings.policy_for("other").max_age_days == 30
    assert settings.policy_for("acme") == RetentionPolicy(max_turns=100)
    with pytest.raises(ConfigError):
        RetentionSettings.from_env({"CONTEXTMODE_RETENTION_MAX_TURNS": "-3"})
    path.write_text(json.dumps({"acme": {"max_turn": 1}}))
    with pytest.raises(ConfigError, match="unknown"):
        RetentionSettings.from_env({"CONTEXTMODE_RETENTION_FILE": str(path)})


# -- export / import ----------------------------------------------------------------

_NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


async def _fill(store: Store, sessions: int) -> None:
    """``sessions`` sessions through the engine (summaries, pins, emotions, users)."""
    engine = build_engine(store=store, settings=replace(EngineSettings(), summary_threshold=4))
    for k in range(sessions):
        user = f"user-{k % 7}"
        for i in range(3 + k % 5):
            msg = f"我叫用户{k}，预算{50 + i}元，不要辣。第{i}个问题：推荐一家餐厅？" if i % 2 == 0 else f"详细说说第{i}点"
            await engine.record("t", f"s-{k:03d}", "user", msg, user_id=user)
            await engine.record("t", f"s-{k:03d}", "assistant", f"回答{k}-{i}：好的，第{i}个建议。")
        await engine.drain()
        await engine.summarize_now("t", f"s-{k:03d}", force=True)
    await engine.drain()


async def _contexts(store: Store, sessions: int) -> list[str]:
    engine = build_engine(store=store)
    out = []
    for k in range(sessions):
        prepared = await engine.prepare("t", f"s-{k:03d}", "那家店在哪？", now=_NOW)
        out.append(json.dumps([[m.role, m.content] for m in prepared.messages], ensure_ascii=False))
    return out


@pytest.mark.parametrize("backend", ["sqlite", "postgres", "redis"])
async def test_export_import_round_trip_gives_identical_contexts(backend: Backend, tmp_path: Path) -> None:
    async with fresh_store_url(backend, tmp_path) as source_url, fresh_store_url(backend, tmp_path) as target_url:
        source, target = open_store(source_url), open_store(target_url)
        try:
            await _fill(source, 100)
            state = await source.load(SessionKey("t", "s-007"))
            assert state.summary is not None and state.constraints  # derived records to carry over
            path = tmp_path / "export.jsonl"
            footer = await write_export(source, path)
            assert footer["sessions"] == 100
            report = await import_records(target, read_export(path))
            assert (report.sessions, report.turns) == (100, footer["turns"])
            assert await _contexts(source, 100) == await _contexts(target, 100)
            a, b = await store_digest(source), await store_digest(target)
            assert (a.sessions, a.turns, a.digest) == (b.sessions, b.turns, b.digest)
            src_info, dst_info = await source.info(SessionKey("t", "s-007")), await target.info(SessionKey("t", "s-007"))
            assert src_info is not None and dst_info is not None
            assert (src_info.user_id, src_info.created_at, src_info.updated_at) == (
                dst_info.user_id, dst_info.created_at, dst_info.updated_at)
            # Importing again writes nothing new (resumable, idempotent).
            again = await import_records(target, read_export(path))
            assert (again.turns, again.skipped_turns) == (0, footer["turns"])
        finally:
            await source.close()
            await target.close()


async def test_import_resumes_a_half_copied_session_and_migrate_verifies(tmp_path: Path) -> None:
    source, target = MemoryStore(), SQLiteStore(tmp_path / "t.db")
    await source.append(SessionKey("t", "s"), [NewTurn(role="user", content=f"第{i}句", tokens=2) for i in range(1200)], user_id="u")
    copied = await source.turns(SessionKey("t", "s"), to_seq=700)  # a migration cut off half-way
    await target.append(SessionKey("t", "s"), [NewTurn(role=t.role, content=t.content, tokens=t.tokens,
                                           created_at=t.created_at) for t in copied])
    report = await migrate(source, target)
    assert report.verified and report.imported.turns == 500 and report.imported.skipped_turns == 700
    await target.close()


async def test_import_rejects_bad_input_with_a_line_number(tmp_path: Path) -> None:
    store = MemoryStore()
    path = tmp_path / "bad.jsonl"
    path.write_text('{"type":"header","format":"contextmode-export","version":1}\n{"type":"turn"}\n')
    with pytest.raises(InputError, match="line 2"):
        await import_records(store, read_export(path))
    path.write_text("not json\n")
    with pytest.raises(InputError, match="line 1"):
        await import_records(store, read_export(path))
    path.write_text('{"type":"header","format":"other","version":1}\n')
    with pytest.raises(InputError, match="contextmode-export"):
        await import_records(store, read_export(path))
    assert await lifecycle_store(store).list_tenants() == []


async def test_export_without_derived_records_has_no_summaries_or_scores() -> None:
    store = MemoryStore()
    await store.append(SessionKey("t", "s"), [NewTurn(role="user", content="x", tokens=1, emotion=0.9)])
    records: list[dict[str, Any]] = [r async for r in export_records(store, derived=False)]
    kinds = [r["type"] for r in records]
    assert kinds == ["header", "session", "turn", "end", "footer"]
    assert records[2]["emotion"] is None


def test_cli_forget_export_import(tmp_path: Path) -> None:
    runner = CliRunner()
    url = f"sqlite:///{tmp_path / 'c.db'}"
    r = runner.invoke(cli_app, ["forget", "--store", url])
    assert r.exit_code != 0 and "--user" in r.output
    r = runner.invoke(cli_app, ["forget", "--tenant", "x", "--store", url])
    assert r.exit_code != 0 and "--yes" in r.output
    r = runner.invoke(cli_app, ["forget", "--user", "nobody", "--store", url])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["counts"].get("sessions", 0) == 0
    r = runner.invoke(cli_app, ["export", str(tmp_path / "e.jsonl"), "--store", url, "--quiet"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(cli_app, ["import", str(tmp_path / "e.jsonl"), "--store", "memory://", "--quiet"])
    assert r.exit_code == 0 and json.loads(r.stdout)["sessions"] == 0


async def test_import_refuses_a_session_with_erased_turns() -> None:
    source = MemoryStore()
    await source.append(SessionKey("t", "s"), new_turns(6))
    await source.erase_turns_before(SessionKey("t", "s"), 4)
    records = export_records(source)
    with pytest.raises(InputError, match="jumps to turn 4"):
        await import_records(MemoryStore(), records)


class _Holder:
    """A stand-in for an engine's caches: which sessions it holds and what it dropped."""

    def __init__(self, held: set[tuple[str, str]]) -> None:
        self.held = held
        self.dropped: list[tuple[str, str]] = []

    def cached_sessions(self) -> set[SessionKey]:
        return {SessionKey(tenant, session_id) for tenant, session_id in self.held}

    def forget_local(self, key: SessionKey) -> dict[str, int]:
        self.held.discard((key.tenant, key.session_id))
        self.dropped.append((key.tenant, key.session_id))
        return {"recall_cache": 1}


async def test_forget_watcher_drops_only_erased_sessions_and_revisits_unfinished_forgets() -> None:
    from contextmode.lifecycle import ForgetWatcher

    store = MemoryStore()
    for sid in ("a", "b", "c"):
        await store.append(SessionKey("t", sid), new_turns(2), user_id="u" if sid != "c" else "v")
    holder = _Holder({("t", "a"), ("t", "b"), ("t", "c"), ("other", "a")})
    watcher = ForgetWatcher(store, holder)
    assert await watcher.poll() == 0  # nothing erased yet
    record = await store.open_deletion("t", "user", "u", actor="test")
    await store.erase_session(SessionKey("t", "a"), record_id=record.id)  # another worker, mid-forget
    assert await watcher.poll() == 1 and holder.dropped == [("t", "a")]
    await store.erase_session(SessionKey("t", "b"), record_id=record.id)
    await store.finish_deletion(record.id, {})
    assert await watcher.poll() == 1 and holder.dropped[-1] == ("t", "b")
    assert await watcher.poll() == 0 and watcher.cursor == record.id
    # A retention run may have pruned turns of a session that stays: the tenant's caches go.
    retention = await store.open_deletion("t", "retention", "*", actor="retention")
    await store.finish_deletion(retention.id, {})
    assert await watcher.poll() == 1 and holder.held == {("other", "a")}


async def test_service_user_routes_and_a_session_never_changes_users(tmp_path: Path) -> None:
    import httpx

    from contextmode.service import ServiceSettings, create_app

    engine = build_engine(store=MemoryStore())
    app = create_app(engine, ServiceSettings(image_dir=tmp_path / "img"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        r = await client.post("/v1/sessions/s1/messages", json={"message": "你好", "user_id": "u1"})
        assert r.status_code == 200
        r = await client.post("/v1/sessions/s1/messages", json={"message": "我是别人", "user_id": "u2"})
        assert r.status_code == 400 and r.json()["code"] == 40001 and "another user" in r.json()["msg"]
        r = await client.post("/v1/sessions/s1/messages", json={"message": "x", "user_id": "../u"})
        assert r.status_code == 400
        r = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                            "user": "u3"}, headers={"x-session-id": "p1"})
        assert r.status_code == 200
        users = (await client.get("/v1/users")).json()["data"]["users"]
        assert sorted(u["user_id"] for u in users) == ["u1", "u3"]
        r = await client.delete("/v1/users/u3")
        assert r.json()["data"]["counts"]["sessions"] == 1
        assert [s["session_id"] for s in (await client.get("/v1/sessions")).json()["data"]["sessions"]] == ["s1"]
        await engine.drain()


# -- a store's kept index heads go with what they hold -------------------------------------


@pytest.mark.parametrize("backend", [pytest.param("postgres", marks=pytest.mark.postgres),
                                     pytest.param("redis", marks=pytest.mark.redis)])
@pytest.mark.parametrize("how", ["erase_session", "erase_turns_before", "purge_idle"])
async def test_erasing_drops_the_last_turn_a_store_kept_in_memory(backend: Backend, how: str, tmp_path: Path) -> None:
    # The append keeps the session's last turn in the process (the next append's index head);
    # erasing must not leave the erased text there, whichever way it is erased.
    async with fresh_store_url(backend, tmp_path) as url:
        store = open_store(url)
        try:
            await store.append(SessionKey("t", "s"), [NewTurn(role="user", content="我对海鲜过敏", tokens=6)])
            heads = store.driver._heads  # type: ignore[attr-defined]
            assert ("t", "s") in heads
            if how == "erase_session":
                await store.erase_session(SessionKey("t", "s"))
            elif how == "erase_turns_before":
                await store.erase_turns_before(SessionKey("t", "s"), 2)
            else:
                assert await store.purge_idle(datetime.now(UTC) + timedelta(days=1)) >= 1
            assert ("t", "s") not in heads
        finally:
            await store.close()
