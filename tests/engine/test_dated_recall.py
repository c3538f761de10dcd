"""Time-aware recall: a question that names a day brings that day's turns, whatever words
they use ("我5月2日的心情怎么样？" shares no word with "今天被老板批评了，很难过")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from contextmode.api import build_engine
from contextmode.settings import EngineSettings
from contextmode.store.memory import MemoryStore
from contextmode.testing.counters import CharTokenCounter
from contextmode.testing.models import FunctionModel

START = datetime(2026, 4, 20, 9, 0, tzinfo=UTC)
NOW = datetime(2026, 5, 6, 20, 0, tzinfo=UTC)

_ZH_FILLER = ["今天去超市买了菜，做了番茄炒蛋。", "好的，听起来不错。", "晚上看了一部电影，还挺好看的。", "是什么电影呀？"]
_EN_FILLER = ["I cooked pasta tonight and it turned out fine.", "Sounds tasty.",
              "We watched a film after dinner.", "Which film was it?"]


async def _session(day_text: str, filler: list[str]) -> tuple[object, str]:
    engine = build_engine(store=MemoryStore(), model=FunctionModel(lambda m: "ok"), counter=CharTokenCounter(),
                          settings=EngineSettings(context_window=500))
    for d in range(16):  # one exchange of filler a day, and the day in question holds the mood
        at = START + timedelta(days=d)
        text = day_text if at.date() == datetime(2026, 4, 22).date() else filler[(2 * d) % 4]
        await engine.record("t", "s", "user", text, created_at=at)
        await engine.record("t", "s", "assistant", filler[(2 * d + 1) % 4], created_at=at + timedelta(minutes=1))
        for i in range(6):
            await engine.record("t", "s", "user" if i % 2 == 0 else "assistant", filler[i % 4],
                                created_at=at + timedelta(minutes=2 + i))
    await engine.drain()
    return engine, "s"


def _shown(prepared: object) -> str:
    """The turns shown verbatim (the summary may paraphrase or drop them)."""
    ctx = prepared.context  # type: ignore[attr-defined]
    return "\n".join(i.text for layer in ctx.layers if layer.name in ("recent", "recall", "key_moments")
                     for i in layer.items)


@pytest.mark.parametrize(("question", "day_text", "filler"), [
    ("我4月22日的心情怎么样？", "今天被老板批评了，很难过。", _ZH_FILLER),
    ("What was my mood on April 22nd?", "My boss yelled at me in front of everyone, I felt awful.", _EN_FILLER),
])
async def test_a_question_naming_a_day_recalls_that_days_turns(question: str, day_text: str, filler: list[str]) -> None:
    engine, sid = await _session(day_text, filler)
    prepared = await engine.prepare("t", sid, question, now=NOW)  # type: ignore[attr-defined]
    assert day_text in _shown(prepared)
    await engine.close()  # type: ignore[attr-defined]


async def test_a_question_naming_no_day_is_unchanged() -> None:
    engine, sid = await _session("今天被老板批评了，很难过。", _ZH_FILLER)
    prepared = await engine.prepare("t", sid, "推荐一部电影吧", now=NOW)  # type: ignore[attr-defined]
    assert "被老板批评" not in _shown(prepared)
    await engine.close()  # type: ignore[attr-defined]


async def test_continue_after_long_answers_sends_the_answer_once_and_opens_with_the_question() -> None:
    """"继续说说" after long exchanges at a 1,500-token window: the previous answer goes once,
    inside the follow-up template, never again clipped as the window's first message."""
    answers = ["关于这个问题，第一点是要注意作息规律，第二点是睡前少看手机，第三点是适当运动。" * 12 + f"（第{i}个回答完）"
               for i in range(3)]
    replies = iter(answers)
    engine = build_engine(store=MemoryStore(), model=FunctionModel(lambda m: next(replies)),
                          counter=CharTokenCounter(), settings=EngineSettings(context_window=1500))
    for question in ("我最近睡不好，有什么办法？", "压力大的时候怎么放松？", "周末适合做什么运动？"):
        await engine.turn("t", "s", question)
    await engine.drain()
    end = "（第2个回答完）"  # the template keeps the end of a long answer
    prepared = await engine.prepare("t", "s", "继续说说")
    messages = prepared.messages
    assert prepared.detection.intent == "detail"
    assert sum(end in m.content for m in messages) == 1
    assert messages[0].role == "system" and messages[1].role == "user"
    await engine.close()
