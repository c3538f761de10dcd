"""Relative and absolute times for dated layers ("三小时前", "3 hours ago")."""

from __future__ import annotations

from datetime import datetime

__all__ = ["format_ago", "format_date"]

_ZH_DIGITS = "零一二三四五六七八九十"


def _zh_number(n: int) -> str:
    if 0 <= n <= 10:
        return _ZH_DIGITS[n]
    if 10 < n < 20:
        return "十" + _ZH_DIGITS[n - 10]
    if 20 <= n < 100:
        tens, ones = divmod(n, 10)
        return _ZH_DIGITS[tens] + "十" + (_ZH_DIGITS[ones] if ones else "")
    return str(n)


def format_ago(then: datetime, now: datetime, locale: str = "zh") -> str:
    """How long before ``now`` the moment ``then`` was, in words ("三小时前")."""
    seconds = max(0.0, (now - then).total_seconds())
    zh = locale.startswith("zh")
    steps = (
        (60, None, None),
        (3600, 60, ("分钟", "minute")),
        (86400, 3600, ("小时", "hour")),
        (86400 * 7, 86400, ("天", "day")),
        (86400 * 30, 86400 * 7, ("周", "week")),
        (86400 * 365, 86400 * 30, ("个月", "month")),
        (float("inf"), 86400 * 365, ("年", "year")),
    )
    for limit, unit_seconds, names in steps:
        if seconds < limit:
            if unit_seconds is None or names is None:
                return "刚刚" if zh else "just now"
            n = max(1, int(seconds // unit_seconds))
            if unit_seconds == 86400 and n == 1:
                return "昨天" if zh else "yesterday"
            if zh:
                return f"{'两' if n == 2 else _zh_number(n)}{names[0]}前"
            return f"{n} {names[1]}{'s' if n != 1 else ''} ago"
    raise AssertionError("unreachable")  # pragma: no cover


def format_date(moment: datetime) -> str:
    """An absolute date and minute, ``2023-05-08 13:56``, for temporal questions."""
    return moment.strftime("%Y-%m-%d %H:%M")
