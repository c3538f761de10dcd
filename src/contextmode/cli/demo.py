"""``contextmode demo``: a sample Chinese conversation, turn by turn, as the model sees it."""

from __future__ import annotations

import os

from rich.console import Console
from rich.rule import Rule

from ..api import DEFAULT_COUNTING_MODEL, build_engine
from ..errors import ConfigError
from ..models.base import ChatModel
from ..settings import EngineSettings
from ..tokens import counter_for_model
from ..types import SessionKey
from .render import prepared_panel, turns_table

__all__ = ["SAMPLE_CONVERSATION", "run_demo"]

SAMPLE_CONVERSATION: tuple[tuple[str, str], ...] = (
    ("你好，我想这周末和朋友聚餐。", "好的！几个人、想吃什么口味、预算大概多少？"),
    ("四个人，我不吃辣，预算人均五十以内。", "明白：四人聚餐、不吃辣、人均50元以内。可以考虑粤菜或江浙菜。"),
    ("最近工作压力好大，真的好累！", "辛苦了……和朋友聚一聚、好好放松一下是个好主意。"),
    ("有没有适合的粤菜馆？", "推荐“点都德”，人均约45元，虾饺和肠粉很受欢迎，口味清淡。"),
    ("那家店在哪？", "点都德在人民路88号，地铁2号线人民广场站步行5分钟。"),
    ("需要提前订位吗？", "周末人多，建议提前一天打电话订位，电话是 020-12345678。"),
    ("我朋友小王对花生过敏。", "记下了：小王对花生过敏，点菜时要避开含花生的菜和花生油。"),
    ("推荐几道菜吧", "虾饺、肠粉、白切鸡、清蒸鱼，都不辣，也不含花生。"),
    ("举个例子", "比如点菜时可以说：“我们有一位朋友对花生过敏，请不要放花生和花生油。”"),
    ("还有别的店吗？", "也可以考虑“外婆家”，杭帮菜，人均约40元，茶香鸡很有名。"),
    ("它周末几点开门？", "外婆家周末上午10点开门，晚上9点半停止点餐。"),
    ("总结一下", "聚餐计划：周六四人，不吃辣，人均50元以内；首选点都德（人民路88号，提前一天订位），备选外婆家；小王花生过敏，点菜时提醒服务员。"),
)
"""(user message, recorded answer) pairs used when no model is configured."""


async def run_demo(
    console: Console, *, store: str | None, session: str = "demo", window: int, show_messages: bool
) -> None:
    """Play `SAMPLE_CONVERSATION` through a real engine, printing each turn's context.

    Without ``store`` the demo runs in a temporary in-memory store; with one, it
    refuses a session that already exists there rather than overwrite it.
    """
    model: ChatModel | None = None
    configured = bool(os.environ.get("CONTEXTMODE_LLM_MODEL"))
    if not configured:
        # No model: play recorded answers, so the demo reads like a real conversation.
        from ..testing.models import ScriptedModel

        model = ScriptedModel([answer for _, answer in SAMPLE_CONVERSATION], name="recorded-demo")
    settings = EngineSettings(context_window=window, summary_threshold=4)
    counter = None if configured else counter_for_model(DEFAULT_COUNTING_MODEL)
    engine = build_engine(store=store or "memory://", model=model, settings=settings, counter=counter)
    tenant = settings.tenant
    key = SessionKey(tenant, session)
    if await engine.store.info(key) is not None:
        await engine.close()
        raise ConfigError(
            f"session {session!r} already exists in --store {store}: the demo never overwrites "
            "a session; pass --session with a new id, or run without --store (temporary store)"
        )
    console.print(Rule("context-mode demo"))
    console.print(
        f"store: {type(engine.store).__name__}{'' if store else ' (temporary)'} · tokens: {engine.counter.name}"
        f"{'' if engine.counter.exact else ' (estimate)'} · model: {engine.model.name} · "
        f"window {window}, strategy {settings.strategy}, offline processors\n"
    )
    try:
        for turn_no, (message, _) in enumerate(SAMPLE_CONVERSATION, 1):
            console.print(Rule(f"turn {turn_no}"))
            console.print(f"[bold]用户:[/bold] {message}")
            result = await engine.turn(tenant, session, message)
            console.print(prepared_panel(result.prepared, show_messages=show_messages))
            answer = result.answer if len(result.answer) < 160 else result.answer[:157] + "…"
            console.print(f"[bold]助手:[/bold] {answer}")
            await engine.drain()  # let summaries and constraints land before the next turn
        state = await engine.store.load(key, recent=4)
        console.print(Rule("after the conversation"))
        console.print(turns_table(state.turns, state.constraints))
        for c in state.constraints:
            console.print(f"📌 [magenta]{c.value}[/magenta]  (from message {c.source_seq}, {c.kind})")
        if state.summary:
            console.print(f"[cyan]summary of messages 1–{state.summary.covers_seq}:[/cyan] {state.summary.text}")
    finally:
        await engine.close()
