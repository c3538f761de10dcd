"""Tool results count against the request limits; ``/healthz`` reports a store that cannot write."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from contextmode.errors import StoreError
from contextmode.service import create_app
from contextmode.service.settings import ServiceSettings
from contextmode.store.base import IdempotencyRecord
from contextmode.store.memory import MemoryStore
from contextmode.types import SessionKey
from tests.service.test_service import client_for, make_engine, make_settings

_BIG = "x" * 5_001


def _openai(result: str) -> dict[str, Any]:
    return {"model": "m", "messages": [
        {"role": "user", "content": "read the file"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": result},
    ]}


def _anthropic(result: str) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 64, "messages": [
        {"role": "user", "content": "read the file"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "read", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": result}]},
    ]}


async def test_tool_results_longer_than_the_limit_are_refused_before_anything_runs(tmp_path: Path) -> None:
    engine = make_engine()
    app = create_app(engine, make_settings(tmp_path, max_tool_result_chars=5_000))
    try:
        async with client_for(app) as client:
            for path, body in (("/v1/chat/completions", _openai(_BIG)), ("/v1/messages", _anthropic(_BIG))):
                r = await client.post(path, json=body, headers={"X-Session-Id": "big"})
                assert r.status_code == 400, r.text
                assert "5001 characters; at most 5000" in r.text
        assert await engine.store.info(SessionKey("local", "big")) is None
    finally:
        await engine.close()
    assert ServiceSettings.from_env({"CONTEXTMODE_MAX_TOOL_RESULT_CHARS": "123"}).max_tool_result_chars == 123


class _FullDisk(MemoryStore):
    """Reads work; every write fails, as on a full disk or a read-only replica."""

    async def claim_idempotency(
        self, tenant: str, key: str, fingerprint: str, *, session_id: str, lease_s: float
    ) -> IdempotencyRecord | None:
        raise StoreError("database or disk is full")


async def test_healthz_reports_a_store_that_cannot_write(tmp_path: Path) -> None:
    for store, status in ((MemoryStore(), 200), (_FullDisk(), 503)):
        engine = make_engine(store=store)
        try:
            async with client_for(create_app(engine, make_settings(tmp_path))) as client:
                r = await client.get("/healthz")
                assert r.status_code == status, r.text
                if status == 503:
                    assert r.json()["msg"] == "store cannot write"
                # The probe leaves nothing behind: a second one works the same.
                assert (await client.get("/healthz")).status_code == status
        finally:
            await engine.close()
