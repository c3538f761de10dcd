"""The day a message names: "5月2日", "上周三", "前天", "May 2nd", "last Tuesday", "yesterday".

Used by time-aware recall (`engine/prepare.py`): a question that names a day ("我5月2日的心情
怎么样？", "What was my mood on May 2nd?") brings that day's turns, whatever words they use.
Relative forms are read against the question's own time; a month and day without a year is
the most recent such day not after it. Only forms that name one day are read: "last week",
"in May" or "recently" name none, and give ``None``.
"""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta

__all__ = ["named_day"]

_MONTHS = {
    name: i + 1
    for i, names in enumerate([
        ("january", "jan"), ("february", "feb"), ("march", "mar"), ("april", "apr"), ("may",),
        ("june", "jun"), ("july", "jul"), ("august", "aug"), ("september", "sep", "sept"),
        ("october", "oct"), ("november", "nov"), ("december", "dec"),
    ])
    for name in names
}
_WEEKDAYS_EN = {name: i for i, name in enumerate(
    ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"))}
"""Full names only: "sun", "sat" and "wed" are words too."""
_WEEKDAYS_ZH = {"一": 0, "二": 1, "三": 2, "四": 3, "五": 4, "六": 5, "日": 6, "天": 6}
_ZH_NUMBER = {"一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9, "十": 10}

_ZH_RELATIVE = {"大前天": 3, "前天": 2, "昨天": 1, "昨日": 1}
_EN_RELATIVE = {"the day before yesterday": 2, "yesterday": 1}
"""Today is left out: its turns are the newest, which the recent window already holds."""
_ZH_MONTH_DAY = re.compile(r"(?:(\d{4})年)?(\d{1,2}|[一二三四五六七八九十]{1,3})月(\d{1,2}|[一二三四五六七八九十]{1,3})[日号]")
_ZH_WEEKDAY = re.compile(r"(上上|上|这|本)?(?:周|星期|礼拜)([一二三四五六日天])")
_EN_MONTH_DAY = re.compile(
    r"\b(" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?\s+(\d{1,2})(?:st|nd|rd|th)?\b(?:,?\s+(\d{4}))?",
    re.I,
)
_EN_DAY_MONTH = re.compile(
    r"\b(\d{1,2})(?:st|nd|rd|th)?\s+(?:of\s+)?(" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\b(?:,?\s+(\d{4}))?",
    re.I,
)
_EN_WEEKDAY = re.compile(r"\b(last|this|on)?\s*(" + "|".join(sorted(_WEEKDAYS_EN, key=len, reverse=True)) + r")\b", re.I)
_ISO = re.compile(r"\b(\d{4})-(\d{1,2})-(\d{1,2})\b")


def _zh_int(text: str) -> int:
    if text.isdigit():
        return int(text)
    if text == "十":
        return 10
    if text.startswith("十"):
        return 10 + _ZH_NUMBER[text[1]]
    if "十" in text:
        tens, _, ones = text.partition("十")
        return _ZH_NUMBER[tens] * 10 + (_ZH_NUMBER[ones] if ones else 0)
    return _ZH_NUMBER.get(text, 0)


def _month_day(month: int, day: int, year: int | None, today: date) -> date | None:
    """That day in ``year``, or the most recent one not after ``today``."""
    try:
        if year is not None:
            return date(year, month, day)
        found = date(today.year, month, day)
        return found if found <= today else date(today.year - 1, month, day)
    except ValueError:
        return None


def _weekday(weekday: int, which: str, today: date) -> date:
    """The ``weekday`` of this week (``this``), of last week (``last``), of the week before
    (``before``); a bare weekday is the most recent one before today."""
    monday = today - timedelta(days=today.weekday())
    if which == "this":
        return monday + timedelta(days=weekday)
    if which == "last":
        return monday - timedelta(days=7) + timedelta(days=weekday)
    if which == "before":
        return monday - timedelta(days=14) + timedelta(days=weekday)
    back = (today.weekday() - weekday) % 7 or 7
    return today - timedelta(days=back)


def _chinese_day(text: str, today: date) -> date | None:
    for word, back in _ZH_RELATIVE.items():
        if word in text:
            return today - timedelta(days=back)
    if m := _ZH_MONTH_DAY.search(text):
        return _month_day(_zh_int(m.group(2)), _zh_int(m.group(3)), int(m.group(1)) if m.group(1) else None, today)
    if m := _ZH_WEEKDAY.search(text):
        which = {"上上": "before", "上": "last", "这": "this", "本": "this"}.get(m.group(1) or "", "")
        return _weekday(_WEEKDAYS_ZH[m.group(2)], which, today)
    return None


def _english_day(text: str, today: date) -> date | None:
    lowered = text.lower()
    for phrase, back in _EN_RELATIVE.items():
        if re.search(rf"\b{phrase}\b", lowered):
            return today - timedelta(days=back)
    if m := _EN_MONTH_DAY.search(text):
        return _month_day(_MONTHS[m.group(1).lower()], int(m.group(2)), int(m.group(3)) if m.group(3) else None, today)
    if m := _EN_DAY_MONTH.search(text):
        return _month_day(_MONTHS[m.group(2).lower()], int(m.group(1)), int(m.group(3)) if m.group(3) else None, today)
    if m := _EN_WEEKDAY.search(text):
        which = {"last": "last", "this": "this"}.get((m.group(1) or "").lower(), "")
        return _weekday(_WEEKDAYS_EN[m.group(2).lower()], which, today)
    return None


def named_day(text: str, now: datetime) -> date | None:
    """The one day ``text`` names, read against ``now`` (its own time zone), or ``None``."""
    today = now.date()
    if m := _ISO.search(text):
        try:
            return date(int(m.group(1)), int(m.group(2)), int(m.group(3)))
        except ValueError:
            return None
    return _chinese_day(text, today) or _english_day(text, today)
