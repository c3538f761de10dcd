"""The inspector page in headless Chromium: past turns opened from their kept trace, and the
rough edges a new user hits (template card, switching session mid-stream, clipped answers,
lost drafts, keyboard use, contrast). Same machinery as ``test_web_browser.py``."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")

from contextmode.service import ServiceSettings, create_app
from tests.web.test_web_browser import (
    WAIT_MS,
    GatedModel,
    LiveServer,
    _engine,
    browser,
    model_server,
    open_page,
    send,
    server,
)

pytestmark = pytest.mark.browser
__all__ = ["browser", "model_server", "server"]

AXE_JS = Path(os.environ.get("CONTEXTMODE_AXE_JS", Path(__file__).resolve().parents[2] / ".ci" / "node" / "node_modules" / "axe-core" / "axe.min.js"))


@pytest.fixture(scope="module")
def stub_server(browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, Any]]:
    """The service with a real OpenAI client answered by the project's stub server, which
    records every request it receives."""
    pytest.importorskip("openai")
    from contextmode.models.factory import model_from_env
    from contextmode.testing.stub_server import StubServer

    tmp = tmp_path_factory.mktemp("web-trace")
    stub = StubServer(chunk_chars=4, chunk_delay=0.002)
    base_url = stub.start()
    try:
        model = model_from_env(
            {
                "CONTEXTMODE_LLM_BASE_URL": base_url,
                "CONTEXTMODE_LLM_MODEL": "stub-model",
                "CONTEXTMODE_LLM_API_KEY": "stub-key",
            }
        )
        app = create_app(_engine(tmp, model), ServiceSettings(image_dir=tmp / "images"))
        with LiveServer(app) as live:
            yield live, stub
    finally:
        stub.stop()


def open_turn(page: Any, turn: int) -> None:
    page.click(f".message.user[data-turn='{turn}'] [data-open-turn]")
    page.wait_for_selector(f"#context-source.past[data-turn='{turn}']", timeout=WAIT_MS)


def shown_messages(page: Any) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = page.eval_on_selector_all(
        "#sent-messages li",
        "rows => rows.map(r => ({role: r.dataset.role, content: r.querySelector('.item-text').textContent}))",
    )
    return rows


def test_a_past_turn_shows_exactly_what_the_model_received(
    browser: Any, stub_server: tuple[LiveServer, Any]
) -> None:
    server, stub = stub_server
    stub.reset()
    page = open_page(browser, f"{server.url}/#session=web-trace")
    for text in ("我不吃辣，预算五十以内", "推荐一家餐厅", "它在哪里？"):
        send(page, text)
    page.reload()
    page.wait_for_selector("body[data-ready=yes]", timeout=WAIT_MS)
    # Turns are numbered by exchange: the second user message is turn 2 (seq 3).
    assert page.get_attribute(".message.user[data-turn='2']", "data-seq") == "3"
    open_turn(page, 2)
    received = stub.chat_requests[1].messages
    assert [{"role": m["role"], "content": m["content"]} for m in received] == shown_messages(page)
    assert page.get_attribute("#sent-messages", "open") is not None
    # Where the turn's time went: its model calls on a timeline, the reply among them.
    assert page.locator("#model-calls li[data-step='reply'][data-priority='reply'] .call-run").count() >= 1
    # Turn 2 went as typed: the diff says so. Turn 3 leaned on turn 2 and was rewritten.
    assert page.get_attribute("#turn-diff", "data-same") == "yes"
    open_turn(page, 3)
    assert shown_messages(page)[-1]["content"] == stub.chat_requests[2].last_user
    if page.get_attribute("#rewrite-card", "data-fate") == "rewrite":
        assert page.get_attribute("#turn-diff", "data-same") == "no"
        assert page.locator("#diff-text ins").count() >= 1
    assert page.errors == []


def test_a_template_follow_up_is_not_called_a_rewrite(browser: Any, stub_server: tuple[LiveServer, Any]) -> None:
    # A real answer first: an engine notice (the offline responder) is no answer to expand.
    server, _ = stub_server
    page = open_page(browser, f"{server.url}/#session=web-template")
    send(page, "介绍一下杭州的西湖")
    send(page, "举个例子")
    card = "#rewrite-card"
    assert page.get_attribute(card, "data-fate") == "template"
    assert page.get_attribute(card, "data-rewritten") == "no"
    assert "追问模板" in page.inner_text(card) and "不是改写" in page.inner_text(card)
    open_turn(page, 2)
    assert page.get_attribute(card, "data-fate") == "template"
    assert page.get_attribute("#turn-diff", "data-same") == "no"
    assert page.errors == []


def test_switching_session_while_streaming_keeps_the_views_apart(
    browser: Any, model_server: tuple[LiveServer, GatedModel]
) -> None:
    server, model = model_server
    page = open_page(browser, f"{server.url}/#session=web-first")
    page.fill("#message-input", "讲个长故事")
    page.press("#message-input", "Enter")
    page.wait_for_selector(".message.assistant[data-state=streaming]", timeout=WAIT_MS)
    page.click("#new-session")
    page.wait_for_selector("#messages .empty", timeout=WAIT_MS)
    other = page.evaluate("location.hash")
    model.gate.set()
    page.wait_for_selector("body[data-sending=no]", timeout=WAIT_MS)
    assert page.evaluate("location.hash") == other
    assert page.locator("#messages .message").count() == 0
    assert "第二段" not in page.inner_text("#messages")
    # The reply went on for its own session and is all there when that session is reopened.
    page.select_option("#session-select", "web-first")
    page.wait_for_selector(".message.assistant[data-state=done]", timeout=WAIT_MS)
    assert "第一段，第二段。" in page.inner_text("#messages")
    assert page.errors == []


def test_the_last_answer_is_not_clipped(browser: Any, server: LiveServer) -> None:
    page = open_page(browser, f"{server.url}/#session=web-clip", height=620)
    for text in ("第一句话", "第二句话，长一些，" * 6, "第三句话"):
        send(page, text)
    last = page.locator(".message.assistant").last
    box = last.bounding_box()
    area = page.locator("#messages").bounding_box()
    assert box["y"] + box["height"] <= area["y"] + area["height"] + 1
    assert box["y"] + box["height"] <= page.viewport_size["height"]
    assert page.errors == [] or all("503" in e for e in page.errors)


def test_a_failed_send_keeps_the_draft(browser: Any, server: LiveServer) -> None:
    page = open_page(browser, f"{server.url}/#session=web-draft")
    envelope = json.dumps({"code": 50301, "msg": "the store is unavailable; try again", "data": None})
    page.route(
        "**/v1/sessions/web-draft/messages",
        lambda route: route.fulfill(status=503, content_type="application/json", body=envelope),
    )
    page.fill("#message-input", "这段话不能丢")
    page.press("#message-input", "Enter")
    page.wait_for_selector(".message.error", timeout=WAIT_MS)
    page.wait_for_selector("body[data-sending=no]", timeout=WAIT_MS)
    assert page.input_value("#message-input") == "这段话不能丢"
    assert "50301" in page.inner_text(".message.error")
    assert page.locator(".message.user").count() == 0
    page.unroute("**/v1/sessions/web-draft/messages")
    send(page, page.input_value("#message-input"))
    assert page.locator(".message.user").count() == 1


def test_keyboard_only(browser: Any, server: LiveServer) -> None:
    page = open_page(browser, f"{server.url}/#session=web-keys")
    page.focus("#message-input")
    page.keyboard.type("我不吃辣")
    page.keyboard.press("Enter")
    page.wait_for_selector(".message.assistant[data-state=done]", timeout=WAIT_MS)
    page.wait_for_selector("body[data-sending=no][data-jobs=idle]", timeout=WAIT_MS)
    # Tab reaches the turn's "what the model received" button; Enter opens it; focus follows.
    page.focus("#session-select")
    for _ in range(40):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.dataset.openTurn") == "1":
            break
    else:
        pytest.fail("Tab never reached the button of turn 1")
    page.keyboard.press("Enter")
    page.wait_for_selector("#context-source.past[data-turn='1']", timeout=WAIT_MS)
    assert page.evaluate("document.activeElement.id") == "context-source"
    outline = page.evaluate(
        "() => { const b = document.querySelector('#send-button'); b.focus();"
        " return getComputedStyle(b).outlineStyle; }"
    )
    assert outline != "none"


def test_no_serious_accessibility_violations(browser: Any, stub_server: tuple[LiveServer, Any]) -> None:
    # A real answer first: the follow-up template expands it (an engine notice is no answer).
    server, _ = stub_server
    if not AXE_JS.exists():
        from tests.web.test_web_browser import _unavailable

        _unavailable(f"axe-core is missing ({AXE_JS}; npm install --prefix .ci/node axe-core)")
    page = open_page(browser, f"{server.url}/#session=web-axe")
    send(page, "我不吃辣，预算五十以内")
    send(page, "举个例子")
    open_turn(page, 1)
    assert serious_violations(page) == []


def serious_violations(page: Any) -> list[str]:
    """axe-core's serious and critical findings on the page as it stands."""
    if not AXE_JS.exists():
        from tests.web.test_web_browser import _unavailable

        _unavailable(f"axe-core is missing ({AXE_JS}; npm install --prefix .ci/node axe-core)")
    # The page's policy refuses inline scripts: axe is evaluated through the driver instead.
    page.evaluate(AXE_JS.read_text(encoding="utf-8"))
    result = page.evaluate("async () => await axe.run(document, {resultTypes: ['violations']})")
    return [
        f"{v['id']} ({v['impact']}): {[n['target'] for n in v['nodes']][:3]}"
        for v in result["violations"]
        if v["impact"] in ("serious", "critical")
    ]


def test_the_inspector_says_why_each_older_turn_was_recalled(browser: Any, server: LiveServer) -> None:
    page = open_page(browser, f"{server.url}/#session=web-recall")
    send(page, "My cat Whiskers sleeps on the old piano")
    for i in range(6):  # long enough that the conversation no longer fits whole: recall brings turn 1
        send(page, " ".join([f"Tell me about the weather in town number {i}."] * 20))
    send(page, "Where does Whiskers sleep?")
    # As sent: the reasons, without the texts (the stream's context event stays small).
    hit = "#recalled-card li[data-seq='1']"
    page.wait_for_selector(hit, timeout=WAIT_MS)
    assert page.get_attribute(hit, "data-layer") == "recall"
    assert {"whisker", "sleep"} <= set(page.get_attribute(hit, "data-matched").split(","))
    why = page.inner_text(f"{hit} .recall-why")
    assert "BM25" in why and "whisker" in why
    # The kept trace of that exchange: the same reasons, and the turn as the model got it.
    open_turn(page, 8)
    page.wait_for_selector(f"{hit} .item-text", timeout=WAIT_MS)
    assert "Whiskers sleeps on the old piano" in page.inner_text(f"{hit} .item-text")
    assert "sleep" in page.get_attribute(hit, "data-matched").split(",")
    # Long texts scroll inside their boxes, reachable by keyboard; nothing serious for axe.
    assert serious_violations(page) == []
    assert page.errors == []


def shown_seqs(page: Any) -> list[int]:
    seqs: list[int] = page.eval_on_selector_all(
        "#messages .message[data-seq]", "nodes => nodes.map(n => Number(n.dataset.seq))"
    )
    return seqs


def test_two_tabs_on_one_session_follow_each_other(browser: Any, server: LiveServer) -> None:
    url = f"{server.url}/#session=web-tabs"
    first = open_page(browser, url)
    second = first.context.new_page()  # a second tab of the same browser
    second.errors = []
    second.on("pageerror", lambda exc: second.errors.append(str(exc)))
    second.goto(url)
    second.wait_for_selector("body[data-ready=yes]", timeout=WAIT_MS)
    elsewhere = open_page(browser, url)  # another browser: nothing shared but the server
    send(first, "第一个标签页说的话")
    for page in (second, elsewhere):  # no reload: the page picks the turn up by itself
        page.wait_for_selector("#messages .message.assistant[data-seq='2']", timeout=WAIT_MS)
        assert "第一个标签页说的话" in page.inner_text("#messages")
    # The second tab continues the session: its turn is number 2, after the first tab's.
    send(second, "第二个标签页接着说")
    assert second.get_attribute(".message.user[data-seq='3']", "data-turn") == "2"
    for page in (first, second, elsewhere):
        page.wait_for_selector("#messages .message[data-seq='4']", timeout=WAIT_MS)
        assert shown_seqs(page) == [1, 2, 3, 4]
        texts = page.inner_text("#messages")
        assert texts.index("第一个标签页说的话") < texts.index("第二个标签页接着说")
    for page in (first, second, elsewhere):
        assert page.errors == []


# Positions of every timeline cell, of the constraint dot inside its cell, and of each legend
# sample against its label, as laid out in the page (the inspector's own renderSession).
_LAYOUT_JS = """async () => {
  const { renderSession } = await import('/static/js/inspector.js');
  const turns = Array.from({ length: 12 }, (_, i) => ({
    seq: i + 1, role: i % 2 ? 'assistant' : 'user', content: 'x', metadata: { turn: Math.floor(i / 2) + 1 } }));
  const session = { session_id: 'layout', last_seq: 12, turns, summary: null, last_answer: null,
    constraints: [{ key: 'spice', value: '不吃辣', source_seq: 5, quote: '我不吃辣' }],
    stats: { summary_covers_seq: 2, summary_version: 1, constraints_version: 1, jobs: {}, pending_jobs: [] } };
  const ctx = { dropped_seqs: [3, 4, 7], layers: [{ name: 'recent', content: [{ seq: 9 }, { seq: 10 }] }] };
  renderSession(session, ctx, 11);
  const box = (r) => ({ x: r.x, y: r.y, w: r.width, h: r.height });
  const cells = [...document.querySelectorAll('#timeline .cell')].map((c) => ({
    seq: +c.dataset.seq, cls: c.className, ...box(c.getBoundingClientRect()) }));
  const pinned = document.querySelector('#timeline .cell.pinned');
  const after = getComputedStyle(pinned, '::after');
  const border = parseFloat(getComputedStyle(pinned).borderTopWidth);
  const legend = [...document.querySelectorAll('.legend .legend-item')].map((item) => {
    const s = item.querySelector('.sample').getBoundingClientRect();
    const r = item.getBoundingClientRect();
    return s.y + s.height / 2 - (r.y + r.height / 2);
  });
  return { cells, dot: { top: parseFloat(after.top) + border, right: parseFloat(after.right) + border,
    w: parseFloat(after.width), h: parseFloat(after.height) }, pinnedBox: box(pinned.getBoundingClientRect()), legend };
}"""


def test_timeline_markers_sit_on_their_own_cells(browser: Any, server: LiveServer) -> None:
    page = open_page(browser, f"{server.url}/#session=web-layout")
    layout = page.evaluate(_LAYOUT_JS)
    cells = layout["cells"]
    assert [c["seq"] for c in cells] == list(range(1, 13))
    marks = {c["seq"]: c["cls"].split() for c in cells}
    assert all("dropped" in marks[s] for s in (3, 4, 7)) and "current" in marks[11]
    assert "pinned" in marks[5] and all("covered" in marks[s] for s in (1, 2))
    assert "in-context" in marks[9] and "in-context" in marks[10]
    # Every cell of the row at the same height and size, in seq order with even steps: a
    # marked cell (dropped, current, pinned…) is never pushed out of line.
    assert {(c["y"], c["h"], c["w"]) for c in cells} == {(cells[0]["y"], cells[0]["h"], cells[0]["w"])}
    steps = {round(b["x"] - a["x"], 1) for a, b in pairwise(cells)}
    assert len(steps) == 1
    # The constraint's dot lies inside its own cell, not in the gap beside the next one.
    dot, cell = layout["dot"], layout["pinnedBox"]
    assert dot["top"] >= 0 and dot["right"] >= 0
    assert dot["top"] + dot["h"] <= cell["h"] and dot["right"] + dot["w"] <= cell["w"]
    # Each legend sample is centred on its label's line.
    assert all(abs(offset) < 0.5 for offset in layout["legend"])
    assert page.errors == []


def test_a_past_turn_shows_its_own_pins_beside_todays(browser: Any, server: LiveServer) -> None:
    """Turn 2 opened after the budget changed at turn 3: the pins the model got at turn 2
    (五十) under their own heading, today's (一百) beside them as "now"; every turn named by
    its exchange number."""
    page = open_page(browser, f"{server.url}/#session=web-then-now")
    send(page, "我不吃辣，预算五十以内")
    send(page, "推荐一家餐厅")
    send(page, "预算改成一百元")
    assert "预算一百元" in page.inner_text("#constraints")
    open_turn(page, 2)
    then = page.inner_text("#pins-then")
    assert "第 2 轮时的约束" in then and "预算五十元以内" in then and "一百" not in then
    assert "来自第 1 轮" in then
    now = page.inner_text("#pins-now")
    assert "现在的约束" in now and "预算一百元" in now and "五十" not in now
    assert serious_violations(page) == []
    # Labels in the page's language: pin keys, job names, the detector's reason, the mode picker.
    session_text = page.inner_text("#session-view")
    assert {"预算", "辣度"} <= set(page.eval_on_selector_all("#pins-now .constraint-key", "ns => ns.map(n => n.textContent)"))
    assert not {"budget", "spice", "constraints", "emotion"} & set(session_text.replace("：", " ").split())
    assert "model p=" not in page.inner_text("#context-view")
    assert page.inner_text("#mode-select option[value='']") == "默认（服务的设置）"
    # A reload shows the newest exchange, turn 3, as it was: its message changed the budget
    # afterwards, so the model still got 五十 then.
    page.reload()
    page.wait_for_selector("body[data-ready=yes]", timeout=WAIT_MS)
    page.wait_for_selector("#context-source.past[data-turn='3']", timeout=WAIT_MS)
    assert "预算五十元以内" in page.inner_text("#pins-then")
    assert "#" not in page.inner_text("#session-view")
    assert page.errors == []


@pytest.mark.parametrize(
    ("locale", "first", "follow_ups"),
    [
        ("zh-CN", "这周的计划：周一健身，周三读书，预算五十以内", ["详细一点", "举个例子", "帮我总结一下这周的计划"]),
        ("en-US", "My plan this week: gym on Monday, reading on Wednesday", ["Tell me more", "Give me an example", "Summarize my plan"]),
    ],
)
def test_follow_ups_on_the_offline_defaults_are_answered_and_keep_the_numbering(
    browser: Any, server: LiveServer, locale: str, first: str, follow_ups: list[str]
) -> None:
    page = open_page(browser, f"{server.url}/#session=web-follow-{locale}", locale=locale)
    send(page, first)
    for text in follow_ups:
        answer = send(page, text)
        assert first[:12] in answer["text"]  # the offline answer shows the exchange it builds on
    assert page.locator(".message.error").count() == 0
    numbers = page.eval_on_selector_all(".message.user", "nodes => nodes.map(n => n.dataset.turn)")
    assert numbers == ["1", "2", "3", "4"]
    # After a reload the inspector shows the newest exchange as it was sent, not a blank pane.
    page.reload()
    page.wait_for_selector("body[data-ready=yes]", timeout=WAIT_MS)
    page.wait_for_selector("#context-source.past[data-turn='4']", timeout=WAIT_MS)
    assert page.errors == []


def test_a_skip_link_and_a_busy_indicator(browser: Any, server: LiveServer) -> None:
    page = open_page(browser, f"{server.url}/#session=web-skip")
    send(page, "我不吃辣")
    # The first Tab stop skips every chat bubble: Enter on it lands in the composer.
    first = "document.querySelector('a[href], button, input, select, textarea, [tabindex]').className"
    assert page.evaluate(first) == "skip-link"
    page.focus(".skip-link")
    assert page.evaluate("document.activeElement.textContent") == "跳到输入框"
    assert page.evaluate("document.querySelector('.skip-link').getBoundingClientRect().top") >= 0  # shown
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "message-input"
    assert page.evaluate("location.hash") == "#session=web-skip"  # the URL still names the session
    # While the page waits for the server, the bar shows and the inspector is aria-busy.
    assert page.evaluate("getComputedStyle(document.querySelector('#busy-bar')).visibility") == "hidden"
    page.evaluate("document.body.dataset.busy = 'yes'")
    assert page.evaluate("getComputedStyle(document.querySelector('#busy-bar')).visibility") == "visible"
    page.evaluate("document.body.dataset.busy = 'no'")
    assert page.get_attribute(".pane.inspector", "aria-busy") == "false"
    assert page.errors == []
