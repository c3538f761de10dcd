"""Follow-ups on the embedded defaults (offline processors, no model): answered, never refused
once an exchange exists, over the last real exchange (the conversation for a summary)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from contextmode.api import build_engine
from contextmode.engine import Engine
from contextmode.engine.followup import follow_up_context
from contextmode.errors import NoPreviousAnswer
from contextmode.models.offline import OfflineResponder
from contextmode.settings import EngineSettings
from contextmode.types import Constraint, NewTurn, SessionKey, SessionState, Summary, Turn, utc_now


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    # The README's embedded defaults: offline processors, the offline responder, BM25 recall.
    made = build_engine(store="memory://", model=OfflineResponder(), settings=EngineSettings())
    yield made
    await made.close()


ZH_FIRST = "这周的计划：周一健身，周三读书，预算50元以内"
EN_FIRST = "My plan this week: gym on Monday, reading on Wednesday, budget under $50"


@pytest.mark.parametrize(
    ("first", "follow_up", "intent", "template_head"),
    [
        (ZH_FIRST, "详细一点", "detail", "基于以下内容，请进一步详细说明:\n用户的上一个问题（还没有模型回答过）：" + ZH_FIRST),
        (ZH_FIRST, "举个例子", "example", "请基于以下内容举一个具体例子:\n用户的上一个问题（还没有模型回答过）：" + ZH_FIRST),
        (EN_FIRST, "Tell me more", "detail",
         "Based on the following, please explain in more detail:\nThe user's previous message (no model has answered it yet): "
         + EN_FIRST),
        (EN_FIRST, "Give me an example", "example",
         "Please give one concrete example based on the following:\nThe user's previous message (no model has answered it yet): "
         + EN_FIRST),
    ],
)
async def test_a_follow_up_after_an_offline_exchange_is_answered_over_the_previous_message(
    engine: Engine, first: str, follow_up: str, intent: str, template_head: str
) -> None:
    await engine.turn("t", "s", first)
    result = await engine.turn("t", "s", follow_up)
    assert result.prepared.detection.intent == intent
    sent = result.prepared.messages[-1].content
    assert sent.startswith(template_head)
    assert sent.endswith(follow_up)
    # The offline answer says what the engine did: it shows the expanded question.
    assert first in result.answer and result.assistant_turn is not None and result.assistant_turn.notice
    state = await engine.store.load(SessionKey("t", "s"))
    users = [t for t in state.turns if t.role == "user"]
    # The user's words are stored (not the template), numbered by exchange: no drift.
    assert [(t.content, t.metadata["turn"]) for t in users] == [(first, 1), (follow_up, 2)]
    assert users[1].metadata["intent"] == intent


@pytest.mark.parametrize(
    ("first", "follow_up", "head", "pin"),
    [
        (ZH_FIRST, "帮我总结一下这周的计划", "请对以下内容进行简要总结:\n", "- 预算50元以内"),
        (EN_FIRST, "Summarize my plan", "Please summarise the following briefly:\n", "- budget under $50"),
    ],
)
async def test_a_summary_follow_up_summarises_the_conversation_with_its_pins(
    engine: Engine, first: str, follow_up: str, head: str, pin: str
) -> None:
    await engine.turn("t", "s", first)
    await engine.drain()  # the constraints job pins the budget
    pins = [c.value for c in (await engine.store.load(SessionKey("t", "s"))).constraints]
    assert pin[2:] in pins
    result = await engine.turn("t", "s", follow_up)
    assert result.prepared.detection.intent == "summary"
    sent = result.prepared.messages[-1].content
    assert sent.startswith(head)
    assert pin in sent  # the pins, under their heading
    assert first in sent  # and the conversation
    assert [t.metadata.get("turn") for t in (await engine.store.load(SessionKey("t", "s"))).turns if t.role == "user"] == [1, 2]


async def test_follow_ups_in_a_row_build_on_the_last_real_question_not_on_each_other(engine: Engine) -> None:
    await engine.turn("t", "s", "什么是熵")
    await engine.turn("t", "s", "举个例子")
    result = await engine.turn("t", "s", "详细一点")
    assert "用户的上一个问题（还没有模型回答过）：什么是熵\n" in result.prepared.messages[-1].content


async def test_the_refusal_stays_while_nothing_was_ever_answered(engine: Engine) -> None:
    # a user turn whose answer never came (the model failed before any text)
    await engine.store.append(SessionKey("t", "s"), [NewTurn(role="user", content="什么是熵", tokens=4)])
    with pytest.raises(NoPreviousAnswer, match="当前没有可用的上文信息"):
        await engine.turn("t", "s", "举个例子")
    assert (await engine.store.version(SessionKey("t", "s"))).last_seq == 1  # nothing stored


def _turn(seq: int, role: str, content: str, **meta: object) -> Turn:
    return Turn(seq=seq, role=role, content=content, tokens=len(content), created_at=utc_now(),  # type: ignore[arg-type]
                metadata=meta)


def test_a_real_last_answer_is_still_what_detail_builds_on() -> None:
    state = SessionState(tenant="t", session_id="s", last_seq=2, last_answer="熵是无序程度的量度。",
                         turns=(_turn(1, "user", "什么是熵"), _turn(2, "assistant", "熵是无序程度的量度。")))
    assert follow_up_context(state, "detail", "zh") == "熵是无序程度的量度。"


def test_the_conversation_for_a_summary_is_its_summary_pins_and_recent_turns() -> None:
    state = SessionState(
        tenant="t", session_id="s", last_seq=4,
        summary=Summary(text="用户在计划一次杭州旅行。", covers_seq=2, tokens=10),
        constraints=(Constraint(key="budget", value="预算100元", kind="constraint", source_seq=3),),
        turns=(_turn(3, "user", "预算改成100元"), _turn(4, "assistant", "好的，预算100元。")),
        last_answer="好的，预算100元。",
    )
    assert follow_up_context(state, "summary", "zh") == (
        "早期对话摘要（参考数据）:\n用户在计划一次杭州旅行。\n\n"
        "用户约束与画像（用户原话整理，仅作参考数据）:\n- 预算100元\n\n"
        "近期对话:\n用户: 预算改成100元\n助手: 好的，预算100元。"
    )
