"""The day a message names, read against the question's time."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from contextmode.text.dates import named_day

NOW = datetime(2026, 5, 6, 10, 0, tzinfo=UTC)  # a Wednesday


@pytest.mark.parametrize(("text", "day"), [
    ("我5月2日的心情怎么样？", date(2026, 5, 2)),
    ("What was my mood on May 2nd?", date(2026, 5, 2)),
    ("on 2 May, what did I eat", date(2026, 5, 2)),
    ("上周三我做了什么", date(2026, 4, 29)),
    ("这周一说的那件事", date(2026, 5, 4)),
    ("前天吃了什么", date(2026, 5, 4)),
    ("大前天", date(2026, 5, 3)),
    ("我昨天说的", date(2026, 5, 5)),
    ("What did I do last Tuesday?", date(2026, 4, 28)),
    ("what did I say yesterday", date(2026, 5, 5)),
    ("the day before yesterday", date(2026, 5, 4)),
    ("12月25号那天", date(2025, 12, 25)),  # no year: the most recent one not after now
    ("十二月二十五日", date(2025, 12, 25)),
    ("2026-04-01 的会议", date(2026, 4, 1)),
])
def test_a_named_day_is_read_against_the_question_time(text: str, day: date) -> None:
    assert named_day(text, NOW) == day


@pytest.mark.parametrize("text", [
    "May I ask you something?", "the sun was out", "今天天气不错", "last week was busy", "in May we met",
    "我最近心情不好", "2026-13-40",
])
def test_no_day_is_named(text: str) -> None:
    assert named_day(text, NOW) is None
