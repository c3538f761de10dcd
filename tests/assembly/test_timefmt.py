"""Relative and absolute times on dated layers ("三小时前", "3 hours ago")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from contextmode.assembly.timefmt import format_ago, format_date

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("delta", "zh", "en"),
    [
        (timedelta(seconds=0), "刚刚", "just now"),
        (timedelta(seconds=59), "刚刚", "just now"),
        (timedelta(minutes=1), "一分钟前", "1 minute ago"),
        (timedelta(minutes=2), "两分钟前", "2 minutes ago"),
        (timedelta(minutes=45), "四十五分钟前", "45 minutes ago"),
        (timedelta(hours=1), "一小时前", "1 hour ago"),
        (timedelta(hours=3), "三小时前", "3 hours ago"),
        (timedelta(hours=3, minutes=59), "三小时前", "3 hours ago"),
        (timedelta(hours=12), "十二小时前", "12 hours ago"),
        (timedelta(hours=23), "二十三小时前", "23 hours ago"),
        (timedelta(days=1), "昨天", "yesterday"),
        (timedelta(days=1, hours=20), "昨天", "yesterday"),
        (timedelta(days=2), "两天前", "2 days ago"),
        (timedelta(days=6), "六天前", "6 days ago"),
        (timedelta(days=7), "一周前", "1 week ago"),
        (timedelta(days=20), "两周前", "2 weeks ago"),
        (timedelta(days=45), "一个月前", "1 month ago"),
        (timedelta(days=300), "十个月前", "10 months ago"),
        (timedelta(days=365), "一年前", "1 year ago"),
        (timedelta(days=365 * 3), "三年前", "3 years ago"),
    ],
)
def test_format_ago(delta: timedelta, zh: str, en: str) -> None:
    assert format_ago(NOW - delta, NOW, "zh") == zh
    assert format_ago(NOW - delta, NOW, "zh-CN") == zh
    assert format_ago(NOW - delta, NOW, "en") == en


def test_format_ago_defaults_to_chinese_and_clamps_the_future() -> None:
    assert format_ago(NOW - timedelta(hours=3), NOW) == "三小时前"
    assert format_ago(NOW + timedelta(hours=3), NOW, "en") == "just now"


def test_large_numbers_in_chinese() -> None:
    assert format_ago(NOW - timedelta(days=365 * 150), NOW, "zh").endswith("年前")
    assert format_ago(NOW - timedelta(days=365 * 11), NOW, "zh") == "十一年前"


def test_format_date() -> None:
    assert format_date(datetime(2023, 5, 8, 13, 56, 42, tzinfo=UTC)) == "2023-05-08 13:56"
