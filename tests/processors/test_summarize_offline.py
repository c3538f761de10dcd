"""Offline incremental summariser: extractive, bounded, language-aware, audited."""

from __future__ import annotations

from datetime import UTC, datetime

from contextmode.processors.audit import audit_summary, split_facts_line
from contextmode.processors.base import Summarizer
from contextmode.processors.summarize import OfflineSummarizer, score_sentence
from contextmode.types import Summary, Turn


def _turn(seq: int, content: str, role: str = "user", **metadata: str) -> Turn:
    return Turn(seq=seq, role=role, content=content, tokens=len(content),  # type: ignore[arg-type]
                created_at=datetime.now(UTC), metadata=metadata)


ZH = [
    _turn(1, "你好"),
    _turn(2, "你好！有什么可以帮你？", "assistant"),
    _turn(3, "我下周三要去北京出差，预算3000元以内，酒店不要太远。"),
    _turn(4, "好的，我帮你查一下北京的酒店。", "assistant"),
    _turn(5, "对了我不吃辣，而且对花生过敏。"),
    _turn(6, "最近工作压力好大，我真的快崩溃了！！"),
    _turn(7, "谢谢"),
    _turn(8, "帮我订下午3点的高铁票，二等座就行。"),
]


async def test_chinese_summary_keeps_numbers_constraints_and_emotion() -> None:
    summarizer = OfflineSummarizer()
    assert isinstance(summarizer, Summarizer)
    result = await summarizer.summarize(None, ZH)
    text = result.text
    assert text.startswith("用户: ")
    assert "3000元" in text and "3点" in text
    assert "不吃辣" in text and "花生" in text
    assert "崩溃" in text and "情绪强度5/5" in text
    assert "用户: 你好" not in text and "谢谢" not in text  # fillers take no room
    assert audit_summary(text, ZH) == []


def test_block_is_bounded_and_audit_restores_what_did_not_fit() -> None:
    result = OfflineSummarizer(block_chars=40).summarize_text(None, ZH)
    body, items = split_facts_line(result.text)
    assert sum(len(line.split(": ", 1)[1]) for line in body.splitlines()) <= 40 + 10
    assert items  # something did not fit, and the audit kept it
    assert audit_summary(result.text, ZH) == []
    unaudited = OfflineSummarizer(block_chars=40, audit=False).summarize_text(None, ZH)
    assert "要点" not in unaudited.text
    assert audit_summary(unaudited.text, ZH)


def test_english_labels_and_speaker_names() -> None:
    turns = [
        _turn(1, "Hi there!"),
        _turn(2, "I need a hotel in Boston for 3 nights, budget $200 a night."),
        _turn(3, "Sure, I will look for hotels near the station.", "assistant"),
    ]
    text = OfflineSummarizer().summarize_text(None, turns).text
    assert text.startswith("User: I need a hotel in Boston")
    assert "Assistant: " in text
    named = OfflineSummarizer().summarize_text(None, [_turn(1, "I adopted a cat named Milo in 2021.", speaker="Caroline")])
    assert named.text.startswith("Caroline: ")


async def test_incremental_summary_keeps_previous_and_grows_slowly() -> None:
    summarizer = OfflineSummarizer(max_chars=260)
    first = await summarizer.summarize(None, ZH)
    previous = Summary(text=first.text, covers_seq=8, tokens=0)
    more = [
        _turn(9, "我叫王小明，住在上海浦东。"),
        _turn(10, "另外下周五晚上7点我要参加公司年会，需要准备一个5分钟的发言。"),
        _turn(11, "我还想买一台2000元左右的笔记本电脑，屏幕要14寸。"),
    ]
    second = await summarizer.summarize(previous, more)
    assert len(second.text) <= 260 + 80  # the facts line may pass the bound a little
    assert "王小明" in second.text
    assert "3000元" in second.text  # an older fact survives, in the body or the facts line
    assert audit_summary(second.text, more) == []
    assert second.text.count("要点: ") <= 1


def test_scores_follow_seed_003_priorities() -> None:
    filler, _ = score_sentence("好的", "zh")
    fact, _ = score_sentence("预算3000元以内，不吃辣", "zh")
    assert fact > filler
    _, level = score_sentence("我真的快崩溃了！！", "zh")
    assert level >= 4
    _, assistant_level = score_sentence("我真的快崩溃了！！", "zh", role="assistant")
    assert assistant_level == 0


def test_the_users_strongest_feeling_survives_a_tight_block() -> None:
    turns = [
        _turn(1, "我下周三去北京出差，预算3000元，住在王府井附近的酒店。"),
        _turn(2, "我真的太难过了，昨天和男朋友分手了！！"),
        _turn(3, "还要订周五下午5点回上海的高铁票，二等座。"),
    ]
    text = OfflineSummarizer(block_chars=30, audit=False).summarize_text(None, turns).text
    assert "分手" in text and "情绪强度" in text
