"""Bytes a session keeps by kind of record (`store.usage`, ``contextmode stats``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contextmode.api import build_engine
from contextmode.engine import TurnRequest
from contextmode.store.usage import reports_usage
from contextmode.testing.backends import fresh_store_url
from contextmode.testing.models import FunctionModel
from contextmode.types import SessionKey
from tests.cli.test_cli import run_cli


async def _chat(url: str, session: str, count: int) -> None:
    engine = build_engine(store=url, model=FunctionModel(lambda m: f"好的，关于「{m[-1].content}」我记下了。"),
                          processors="offline")
    try:
        for i in range(count):
            await engine.turn(TurnRequest(key=SessionKey("t", session), message=f"第{i}句：我们聊聊周末去哪里吃饭"))
        await engine.drain()
    finally:
        await engine.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgres", "redis"])
async def test_each_kind_of_record_is_counted_and_grows_with_the_session(backend: str, tmp_path: Path) -> None:
    async with fresh_store_url(backend, tmp_path) as url:  # type: ignore[arg-type]
        await _chat(url, "small", 2)
        await _chat(url, "big", 6)
        from contextmode.store import open_store

        store = open_store(url)
        usage: object = store
        try:
            assert reports_usage(usage)
            small = await usage.session_bytes(SessionKey("t", "small"))
            big = await usage.session_bytes(SessionKey("t", "big"))
            assert await usage.session_bytes(SessionKey("t", "nobody")) == {}
        finally:
            await store.close()
    for kinds in (small, big):
        assert {"sessions", "turns", "traces", "recall_postings"} <= set(kinds), kinds
        assert all(size > 0 for size in kinds.values())
    for kind in ("turns", "traces"):
        assert big[kind] > 2 * small[kind], (kind, small, big)


def test_stats_command_prints_the_kinds_and_says_an_unknown_session_in_one_line(tmp_path: Path) -> None:
    import asyncio

    url = f"sqlite:///{tmp_path / 'cm.db'}"
    asyncio.run(_chat(url, "demo", 3))
    result = run_cli("stats", "demo", "--tenant", "t", "--store", url, "--json", home=tmp_path)
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)
    assert stats["exchanges"] == 3 and stats["total_bytes"] == sum(stats["bytes"].values())
    assert stats["bytes"]["turns"] >= stats["raw_text_bytes"] > 0
    table = run_cli("stats", "demo", "--tenant", "t", "--store", url, home=tmp_path)
    assert table.returncode == 0 and "traces" in table.stdout and "per exchange" in table.stdout
    missing = run_cli("stats", "nobody", "--store", url, home=tmp_path)
    assert missing.returncode == 1
    assert missing.stderr.strip().splitlines() == ["error: no session 'nobody' for tenant 'local'"]
