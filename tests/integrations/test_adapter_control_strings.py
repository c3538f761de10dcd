"""Every framework adapter hands its framework no chat-template control string whole: the
memory layers and the recent turns it converts from an assembled context hold the strings of
issue 39 broken, as `to_messages` does."""

from __future__ import annotations

import json
from typing import Any

import pytest

from contextmode.api import build_engine
from contextmode.assembly import Context
from contextmode.settings import EngineSettings
from contextmode.store import MemoryStore
from contextmode.testing.counters import CharTokenCounter
from contextmode.testing.models import FunctionModel
from contextmode.types import SessionKey, Turn
from tests.assembly.test_control_strings import ALL_STRINGS, PLANTED, SPEAKER

T, S = "t", "s"


async def _context() -> tuple[Context, list[Turn]]:
    engine = build_engine(store=MemoryStore(), model=FunctionModel(lambda m: "好的"), counter=CharTokenCounter(),
                          settings=EngineSettings(summary_threshold=2))
    # Planted early (memory layers) and late (recent turns).
    for text in [*PLANTED, SPEAKER, *(f"闲聊 {i}" for i in range(6)), *PLANTED[:2]]:
        await engine.turn(T, S, text)
        await engine.drain()
    prepared = await engine.prepare(T, S, "管理员密码是什么？")
    turns = list(await engine.store.turns(SessionKey(T, S)))
    await engine.close()
    return prepared.context, turns


def _langchain(ctx: Context, turns: list[Turn]) -> list[Any]:
    from contextmode.integrations.langchain import context_to_messages

    return [m.content for m in context_to_messages(ctx)]


def _llama_index(ctx: Context, turns: list[Turn]) -> list[Any]:
    from contextmode.integrations.llama_index import context_to_messages

    return [m.content for m in context_to_messages(ctx)]


def _pydantic_ai(ctx: Context, turns: list[Turn]) -> list[Any]:
    from contextmode.integrations.pydantic_ai import context_to_messages

    return [part.content for m in context_to_messages(ctx) for part in m.parts]


def _openai_agents(ctx: Context, turns: list[Turn]) -> list[Any]:
    from contextmode.integrations.openai_agents import context_to_items

    return list(context_to_items(ctx, {t.seq: t for t in turns}, None, current=False))


@pytest.mark.parametrize("convert", [_langchain, _llama_index, _pydantic_ai, _openai_agents])
async def test_no_adapter_passes_a_control_string_whole(convert: Any) -> None:
    ctx, turns = await _context()
    shown = json.dumps(convert(ctx, turns), ensure_ascii=False, default=str)
    assert "管理员" in shown  # the planted turns are in what the framework gets
    for s in ALL_STRINGS:
        assert json.dumps(s, ensure_ascii=False)[1:-1] not in shown, s
