"""``EngineSettings(pii="mask")``: personal data never reaches what is stored, while the
current message still reaches the model as typed; ``keep`` stores it as typed."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from contextmode.api import build_engine
from contextmode.engine import Engine
from contextmode.engine.privacy import PII_COUNT_KEY, keepable_trace
from contextmode.errors import ConfigError
from contextmode.settings import EngineSettings
from contextmode.store import open_store
from contextmode.testing.counters import CharTokenCounter
from contextmode.testing.models import FunctionModel
from contextmode.text.pii import mask_pii
from contextmode.types import ChatMessage, SessionKey

T, S = "t", "s"

PHONE, ID_CARD, CARD, EMAIL = "13812345678", "11010519491231002X", "6222021234567890128", "zhang.san@example.com"
INTL = "+1 415-555-2671"
PLANTED = (PHONE, ID_CARD, CARD, EMAIL, INTL)
MESSAGES = (
    f"我的手机号是{PHONE}，我不吃辣",
    f"我叫张三，身份证号{ID_CARD}，退款打到卡号{CARD}",
    f"邮箱 {EMAIL} 记一下，美国的同事电话 {INTL}",
    "订单号 20231105123456 的价格是 1299.00 元，版本 3.10.2，2023-11-05 14:30 下的单",
    *(f"闲聊 {i}" for i in range(8)),
    "你还记得我的手机号吗？",
)


def _engine(url: str, pii: str, seen: list[Sequence[ChatMessage]]) -> Engine:
    def model(messages: Sequence[ChatMessage]) -> str:
        seen.append(messages)
        return f"好的，记下了：{messages[-1].content}"  # the answer repeats the values

    return build_engine(
        store=open_store(url), model=FunctionModel(model), counter=CharTokenCounter(),
        settings=EngineSettings(pii=pii, summary_threshold=2),  # type: ignore[arg-type]
    )


async def _converse(engine: Engine) -> None:
    for text in MESSAGES:
        await engine.turn(T, S, text)
        await engine.drain()


def test_masking_is_precise_on_the_issue_examples() -> None:
    masked = mask_pii(MESSAGES[0] + MESSAGES[1] + MESSAGES[2])
    assert "138****5678" in masked.text
    assert dict(masked.counts) == {"phone": 2, "id_card": 1, "bank_card": 1, "email": 1}
    assert not any(value in masked.text for value in PLANTED)
    assert mask_pii(MESSAGES[3]).text == MESSAGES[3]  # order number, price, version, date, time


async def test_masked_session_leaves_no_planted_value_in_the_sqlite_files(tmp_path: Path) -> None:
    seen: list[Sequence[ChatMessage]] = []
    engine = _engine(f"sqlite:///{tmp_path}/cm.db", "mask", seen)
    await _converse(engine)
    # The current turn reached the model as typed, each time.
    assert [m[-1].content for m in seen] == list(MESSAGES)
    turns = await engine.store.turns(SessionKey(T, S))
    assert turns[0].content == "我的手机号是138****5678，我不吃辣"
    assert turns[0].metadata[PII_COUNT_KEY] == {"phone": 1}
    assert turns[1].metadata[PII_COUNT_KEY] == {"phone": 1}  # the answer repeated it
    assert turns[6].content == MESSAGES[3]  # nothing to mask: as typed
    # Later turns see the masked form.
    later = "\n".join(m.content for m in seen[-1][:-1])
    assert "138****5678" in later and PHONE not in later
    trace = await engine.trace(SessionKey(T, S), 2)
    assert trace.typed.startswith("我叫张三，身份证号110")
    assert trace.pii_masked == {"id_card": 2, "bank_card": 2}  # the message and the answer repeating it
    assert (await engine.trace(SessionKey(T, S), 4)).pii_masked == {}
    _assert_none_planted(tmp_path)  # the database and its WAL, while open
    await engine.close()
    _assert_none_planted(tmp_path)  # and checkpointed


def _assert_none_planted(folder: Path) -> None:
    files = sorted(folder.glob("cm.db*"))
    assert any(f.name == "cm.db" for f in files)
    data = b"".join(f.read_bytes() for f in files)
    assert b"138****5678" in data
    for value in PLANTED:
        assert value.encode() not in data, value


async def test_keep_stores_what_was_typed(tmp_path: Path) -> None:
    engine = _engine(f"sqlite:///{tmp_path}/cm.db", "keep", [])
    await _converse(engine)
    turns = await engine.store.turns(SessionKey(T, S))
    assert [t.content for t in turns if t.role == "user"] == list(MESSAGES)
    assert all(PII_COUNT_KEY not in t.metadata for t in turns)
    await engine.close()


def test_the_policy_is_checked() -> None:
    with pytest.raises(ConfigError, match="CONTEXTMODE_PII"):
        EngineSettings(pii="hide")  # type: ignore[arg-type]
    assert EngineSettings.from_env({"CONTEXTMODE_PII": "mask"}).pii == "mask"
    assert EngineSettings.from_env({}).pii == "keep"


async def _postgres_rows(url: str) -> bytes:
    import asyncpg

    dsn, _, schema = url.partition("?schema=")
    conn = await asyncpg.connect(dsn)
    try:
        tables = await conn.fetch("SELECT table_name FROM information_schema.tables WHERE table_schema = $1", schema)
        rows = [
            row[0] for t in tables
            for row in await conn.fetch(f'SELECT t::text FROM "{schema}"."{t["table_name"]}" t')
        ]
    finally:
        await conn.close()
    assert tables
    return "\n".join(rows).encode()


async def _redis_values(url: str) -> bytes:
    import redis.asyncio as aioredis

    base, _, namespace = url.partition("?namespace=")
    client = aioredis.from_url(base)
    out: list[bytes] = []
    try:
        async for key in client.scan_iter(match=f"{namespace}*"):
            kind = (await client.type(key)).decode()
            out.append(key)
            if kind == "string":
                out.append(await client.get(key) or b"")
            elif kind == "hash":
                out.extend(v for pair in (await client.hgetall(key)).items() for v in pair)
            elif kind == "list":
                out.extend(await client.lrange(key, 0, -1))
            elif kind == "set":
                out.extend(await client.smembers(key))
            elif kind == "zset":
                out.extend(await client.zrange(key, 0, -1))
            elif kind == "stream":
                out.extend(v for _, fields in await client.xrange(key) for pair in fields.items() for v in pair)
    finally:
        await client.aclose()
    return b"\n".join(out)


@pytest.mark.parametrize("backend", [pytest.param("postgres", marks=pytest.mark.postgres),
                                     pytest.param("redis", marks=pytest.mark.redis)])
async def test_masked_session_leaves_no_planted_value_in_the_server_rows(backend: str, tmp_path: Path) -> None:
    from contextmode.testing.backends import fresh_store_url

    async with fresh_store_url(backend, tmp_path) as url:  # type: ignore[arg-type]
        engine = _engine(url, "mask", [])
        await _converse(engine)
        await engine.trace(SessionKey(T, S), 2)
        await engine.close()
        data = await (_postgres_rows(url) if backend == "postgres" else _redis_values(url))
    assert b"138****5678" in data
    for value in PLANTED:
        # as text, and as the hex a bytea column shows
        assert value.encode() not in data and value.encode().hex().encode() not in data, value


async def test_a_tenant_can_mask_while_the_others_keep() -> None:
    from contextmode.store import MemoryStore

    engine = build_engine(
        store=MemoryStore(), model=FunctionModel(lambda m: "好的"), counter=CharTokenCounter(),
        settings=EngineSettings(pii_tenants={"acme": "mask"}),
    )
    for tenant in ("acme", "other"):
        await engine.turn(tenant, S, MESSAGES[0])
    await engine.drain()
    assert (await engine.store.turns(SessionKey("acme", S)))[0].content == "我的手机号是138****5678，我不吃辣"
    assert (await engine.store.turns(SessionKey("other", S)))[0].content == MESSAGES[0]
    assert "138****5678" in (await engine.trace(SessionKey("acme", S), 1)).typed
    assert PHONE in (await engine.trace(SessionKey("other", S), 1)).typed
    await engine.close()


def test_tenant_policies_come_from_the_environment() -> None:
    settings = EngineSettings.from_env({"CONTEXTMODE_PII_TENANTS": "acme=mask, beta=keep"})
    assert (settings.pii_for("acme"), settings.pii_for("beta"), settings.pii_for("x")) == ("mask", "keep", "keep")
    with pytest.raises(ConfigError, match="CONTEXTMODE_PII_TENANTS"):
        EngineSettings.from_env({"CONTEXTMODE_PII_TENANTS": "acme:mask"})


def test_a_masked_trace_keeps_its_time() -> None:
    # Some times' digits look like personal data to the masker ("…16.822740…" lost a digit),
    # and the trace then failed to read back and was not kept.
    from datetime import UTC, datetime

    from contextmode.store.records import TurnTrace

    when = datetime(2026, 12, 6, 4, 53, 16, 822740, tzinfo=UTC)
    trace = TurnTrace(turn=1, user_seq=1, answer_seq=2, created_at=when, typed=f"call {PHONE}", sent=f"call {PHONE}")
    kept = keepable_trace("mask", trace)
    assert kept.created_at == when
    assert PHONE not in kept.typed and PHONE not in kept.sent
