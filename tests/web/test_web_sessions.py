"""The first hour of a new user (issue 36), in headless Chromium on the embedded defaults
(no model configured: the offline responder and the offline processors).

A 20-message Chinese session and a 10-message English one, typed the way a person would:
follow-ups answered, never refused, once an exchange exists; one numbering (exchanges)
everywhere; a budget changed half-way; a past turn shown entirely as it was, its own pins
beside today's; axe-core clean in every state reached; labels in the page's language.
``CONTEXTMODE_UPDATE_SCREENSHOT=1`` writes the screenshots into ``docs/img/`` (docs/web.md).
Same machinery as ``test_web_browser.py``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")

from tests.web.test_web_browser import (
    DOCS_IMG,
    WAIT_MS,
    LiveServer,
    browser,
    open_page,
    send,
    server,
)
from tests.web.test_web_traces import open_turn, serious_violations, shown_messages

pytestmark = pytest.mark.browser
__all__ = ["browser", "server"]

ZH_MESSAGES = [
    "我不吃辣，预算五十以内",
    "推荐一家餐厅",
    "那家店在哪？",
    "详细一点",
    "举个例子",
    "还有别的推荐吗",
    "第二家店在哪",
    "预算改成一百元",
    "那它几点关门？",
    "周末也开吗？",
    "帮我总结一下这周的计划",
    "我对花生过敏",
    "明天去杭州出差",
    "推荐一个酒店",
    "离西湖近一点的",
    "价格多少",
    "有早餐吗",
    "好的，就这个",
    "详细一点",
    "那家餐厅叫什么来着？",
]
EN_MESSAGES = [
    "I'm vegetarian and my budget is $20 per meal",
    "Suggest a dinner place",
    "Where is it?",
    "Tell me more",
    "Give me an example",
    "Raise the budget to $40",
    "Is it open on Sunday?",
    "Summarize my plan",
    "I'm allergic to peanuts",
    "What did I say about the budget?",
]
REFUSALS = ("42201", "no previous answer", "NoPreviousAnswer", "没有上一条回答", "没有可以展开的回答")
NOTICE_LINES = 12
"""An offline notice bubble stays short: the notice, the question as sent, a few messages."""
_CJK = re.compile(r"[\u3400-\u9fff\uff01-\uff5e，。：；、（）「」【】《》]")


def _out(tmp_path: Path) -> Path:
    return DOCS_IMG if os.environ.get("CONTEXTMODE_UPDATE_SCREENSHOT") == "1" else tmp_path


def _screenshot(page: Any, path: Path) -> None:
    """The page with the past turn's question in the chat and its pins, then and now, in view."""
    page.locator(".message.user[data-turn] [data-open-turn]").last.wait_for(timeout=WAIT_MS)
    turn = page.get_attribute("#context-source", "data-turn")
    page.locator(f".message.user[data-turn='{turn}']").scroll_into_view_if_needed()
    page.evaluate("document.querySelector('#pins-then').scrollIntoView({block: 'start'})")
    page.screenshot(path=str(path))
    assert path.read_bytes().startswith(b"\x89PNG")


def _conversation(page: Any, messages: list[str]) -> list[dict[str, Any]]:
    answers = []
    for text in messages:
        answer = send(page, text)
        assert not any(r in answer["text"] for r in REFUSALS), (text, answer["text"])
        assert answer["text"].count("\n") + 1 <= NOTICE_LINES, (text, answer["text"])
        answers.append(answer)
    assert page.locator(".message.error").count() == 0
    return answers


def _built_on(answers: list[dict[str, Any]], templates: tuple[int, ...], quoted: str, *, summary: int,
              pins: tuple[str, ...]) -> None:
    """The offline answers to the detail/example follow-ups show the exchange they build on;
    the one to the summary request shows today's pins."""
    assert all(quoted in answers[i]["text"] for i in templates)
    assert all(pin in answers[summary]["text"] for pin in pins)


def _one_budget_pin(page: Any, value: str, source: str, *, gone: tuple[str, ...]) -> None:
    budget = page.locator("#constraints li[data-key=budget]")
    assert budget.count() == 1 and value in budget.inner_text() and source in budget.inner_text()
    pins = page.inner_text("#constraints")
    assert not [old for old in gone if old in pins]


def _numbering(page: Any, turns: int) -> None:
    """One numbering: bubbles by exchange, and every "turn N" the inspector names an exchange."""
    numbers = page.eval_on_selector_all(".message.user", "nodes => nodes.map(n => Number(n.dataset.turn))")
    assert numbers == list(range(1, turns + 1))
    shown = page.inner_text("#context-view") + page.inner_text("#session-view")
    assert not re.search(r"#\d|\bseq\b", shown)  # no storage numbers ("#7", "seq 13")
    found = re.findall(r"第 (\d+)(?:–(\d+))? 轮", shown) + re.findall(r"\bturns? (\d+)(?:–(\d+))?", shown)
    named = [int(n) for pair in found for n in pair if n]
    assert named and max(named) <= turns


def test_a_chinese_session_of_twenty_messages(browser: Any, server: LiveServer, tmp_path: Path) -> None:
    page = open_page(browser, f"{server.url}/#session=first-hour-zh")
    assert serious_violations(page) == []  # an empty session
    answers = _conversation(page, ZH_MESSAGES[:3])
    assert serious_violations(page) == []  # the first exchanges, the inspector filled
    answers += _conversation(page, ZH_MESSAGES[3:])
    # Follow-ups on the offline defaults are answered by what the engine built: the detail and
    # example templates over the last exchange, the summary over the conversation and its pins.
    _built_on(answers, (3, 4), "那家店在哪？", summary=10, pins=("预算一百元", "不吃辣"))
    _numbering(page, 20)
    # The budget changed at turn 8: one budget pin, today's.
    _one_budget_pin(page, "预算一百元", "来自第 8 轮", gone=("五十",))
    assert {"预算", "辣度", "过敏：花生"} <= set(
        page.eval_on_selector_all("#constraints .constraint-key", "ns => ns.map(n => n.textContent)")
    )

    # Turn 5 (举个例子), opened after the change: everything as it was then, today's pins beside.
    open_turn(page, 5)
    assert page.get_attribute("#rewrite-card", "data-fate") == "template"
    sent = shown_messages(page)
    assert sent[-1]["content"].endswith("举个例子") and "预算五十元以内" in sent[0]["content"]
    then, now = page.inner_text("#pins-then"), page.inner_text("#pins-now")
    assert "第 5 轮时的约束" in then and "预算五十元以内" in then and "一百" not in then
    assert "现在的约束" in now and "预算一百元" in now and "五十" not in now
    assert serious_violations(page) == []
    _screenshot(page, _out(tmp_path) / "session-zh.png")

    # A preview of a next message, then a reload: the newest exchange as it was sent.
    page.fill("#message-input", "还有别的吗")
    page.click("#preview-button")
    page.wait_for_selector("#context-source.preview", timeout=WAIT_MS)
    assert serious_violations(page) == []
    page.reload()
    page.wait_for_selector("body[data-ready=yes]", timeout=WAIT_MS)
    page.wait_for_selector("#context-source.past[data-turn='20']", timeout=WAIT_MS)
    _numbering(page, 20)
    assert serious_violations(page) == []
    assert page.errors == []


def test_an_english_session_of_ten_messages(browser: Any, server: LiveServer, tmp_path: Path) -> None:
    page = open_page(browser, f"{server.url}/#session=first-hour-en", locale="en-US")
    answers = _conversation(page, EN_MESSAGES[:1])
    assert serious_violations(page) == []
    answers += _conversation(page, EN_MESSAGES[1:])
    _built_on(answers, (3, 4), "Where is it?", summary=7, pins=("$40", "vegetarian"))
    _numbering(page, 10)
    # "Raise the budget to $40" replaced the pin: one budget, no raw copy of the old one.
    _one_budget_pin(page, "budget $40", "from turn 6", gone=("$20", "20 per meal", "fact"))
    assert "allergy: peanuts" in page.inner_text("#constraints")
    # Labels in the page's language: nothing Chinese in an English page of English messages
    # (but the language toggle, which names the other language in its own: 中文).
    chrome = page.inner_text("#context-view") + page.inner_text("#session-view") + page.inner_text(".topbar h1")
    chrome += " ".join(page.eval_on_selector_all(".controls label", "ns => ns.map(n => n.innerText)"))
    assert not _CJK.search(chrome), _CJK.findall(chrome)
    assert "model p=" not in chrome

    # Turn 7, after the raise: the model was told $40, not $20.
    open_turn(page, 7)
    system = shown_messages(page)[0]["content"]
    assert "$40" in system and "$20" not in system
    # Turn 3, before it: $20 then, $40 now.
    open_turn(page, 3)
    then, now = page.inner_text("#pins-then"), page.inner_text("#pins-now")
    assert "Pins at turn 3" in then and "budget $20 per meal" in then and "$40" not in then
    assert "Pins now" in now and "budget $40" in now and "$20" not in now
    assert serious_violations(page) == []
    _screenshot(page, _out(tmp_path) / "session-en.png")
    page.reload()
    page.wait_for_selector("body[data-ready=yes]", timeout=WAIT_MS)
    page.wait_for_selector("#context-source.past[data-turn='10']", timeout=WAIT_MS)
    assert serious_violations(page) == []
    assert page.errors == []
