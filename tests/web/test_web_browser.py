"""The inspector page in headless Chromium (Debian's ``chromium``, driven by Playwright).

A real service runs on a free loopback port (uvicorn in a thread) around
`build_engine` with its defaults: the offline responder and the offline
processors. The tests type into the page the way a person would and read what
it shows. They skip when Chromium or Playwright is missing, and fail instead
when ``CI=true``. ``CONTEXTMODE_UPDATE_SCREENSHOT=1`` rewrites the screenshots
in ``docs/img/`` (docs/web.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import struct
import threading
import zlib
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("fastapi")

from contextmode.api import build_engine
from contextmode.engine import Processors
from contextmode.errors import ModelUnavailable
from contextmode.service import ServiceSettings, create_app
from contextmode.settings import EngineSettings
from contextmode.testing.ci import ci_required
from contextmode.types import ChatMessage

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
IN_CI = ci_required()
DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"
WAIT_MS = 30_000
"""Upper bound for one wait on the page (a turn, or its background jobs); not a speed assertion."""


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason}: CI must run the browser tests")
    pytest.skip(reason)


class LiveServer:
    """The service on 127.0.0.1 with an OS-chosen port, served by uvicorn in a daemon thread."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> LiveServer:
        self.thread.start()
        started = threading.Event()
        while not self.server.started and self.thread.is_alive():
            started.wait(0.05)
        if not self.server.started:
            raise RuntimeError("uvicorn did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.sock.close()


class GatedModel:
    """Streams like a remote model: a first delta, then waits for the test's go-ahead (`gate`).

    A message containing 出错 gets half an answer and then a provider failure.
    """

    name = "gpt-4o-mini"

    def __init__(self) -> None:
        self.gate = threading.Event()

    async def stream(
        self, messages: Sequence[ChatMessage], *, max_tokens: int | None = None
    ) -> AsyncIterator[str]:
        if "出错" in messages[-1].content:
            yield "说到一半"
            raise ModelUnavailable("upstream closed the stream")
        yield "第一段，"
        for _ in range(3000):  # at most 30 s, so a failed test cannot hang the server
            if self.gate.is_set():
                break
            await asyncio.sleep(0.01)
        yield "第二段。"

    async def complete(
        self, messages: Sequence[ChatMessage], *, max_tokens: int | None = None
    ) -> str:
        return "".join([chunk async for chunk in self.stream(messages, max_tokens=max_tokens)])


class GatedExtractor:
    """The offline constraint extractor, held back until the test opens `gate` (a job that takes
    a while); a turn containing 故障 makes it fail."""

    def __init__(self) -> None:
        from contextmode.processors.constraints import OfflineConstraintExtractor

        self.inner = OfflineConstraintExtractor()
        self.gate = threading.Event()

    async def extract(self, turn: Any, current: Any) -> Any:
        for _ in range(3000):  # at most 30 s
            if self.gate.is_set():
                break
            await asyncio.sleep(0.01)
        if "故障" in turn.content:
            raise RuntimeError("extractor unavailable")
        return await self.inner.extract(turn, current)


def _engine(tmp: Path, model: Any = None, *, job_attempts: int = 3, **overrides: Any) -> Any:
    # The defaults (offline responder, offline processors) with a small window, so a short
    # conversation already shows summaries and dropped turns.
    settings = dataclasses.replace(
        EngineSettings.from_env({}),
        context_window=1400,
        summary_threshold=4,
        job_attempts=job_attempts,
    )
    return build_engine(
        store=f"sqlite:///{tmp / 'web.db'}", settings=settings, model=model, **overrides
    )


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        _unavailable(f"{CHROMIUM} is missing (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed (pip install playwright)")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def server(browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("web")
    # Deltas sent as they come (no coalescing): the page must render a stream piece by piece.
    app = create_app(_engine(tmp), ServiceSettings(image_dir=tmp / "images", stream_flush_ms=0))
    with LiveServer(app) as live:
        yield live


@pytest.fixture(scope="module")
def auth_server(browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("web-auth")
    app = create_app(
        _engine(tmp), ServiceSettings(image_dir=tmp / "images", api_keys={"key-acme": "acme"})
    )
    with LiveServer(app) as live:
        yield live


@pytest.fixture(scope="module")
def model_server(
    browser: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LiveServer, GatedModel]]:
    tmp = tmp_path_factory.mktemp("web-model")
    model = GatedModel()
    app = create_app(_engine(tmp, model), ServiceSettings(image_dir=tmp / "images"))
    try:
        with LiveServer(app) as live:
            yield live, model
    finally:
        model.gate.set()


@pytest.fixture(scope="module")
def jobs_server(
    browser: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LiveServer, GatedExtractor]]:
    tmp = tmp_path_factory.mktemp("web-jobs")
    extractor = GatedExtractor()
    engine = _engine(tmp, processors=dataclasses.replace(Processors.offline(), extractor=extractor), job_attempts=1)
    app = create_app(engine, ServiceSettings(image_dir=tmp / "images"))
    try:
        with LiveServer(app) as live:
            yield live, extractor
    finally:
        extractor.gate.set()


@pytest.fixture(scope="module")
def openai_server(browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """The service with a real OpenAI client, answered by the project's stub server over HTTP."""
    pytest.importorskip("openai")
    from contextmode.models.factory import model_from_env
    from contextmode.testing.stub_server import StubServer

    tmp = tmp_path_factory.mktemp("web-openai")
    with StubServer(chunk_chars=3, chunk_delay=0.005) as base_url:
        model = model_from_env(
            {
                "CONTEXTMODE_LLM_BASE_URL": base_url,
                "CONTEXTMODE_LLM_MODEL": "stub-model",
                "CONTEXTMODE_LLM_API_KEY": "stub-key",
            }
        )
        app = create_app(_engine(tmp, model), ServiceSettings(image_dir=tmp / "images", stream_flush_ms=0))
        with LiveServer(app) as live:
            yield live


def open_page(
    browser: Any, url: str, *, locale: str = "zh-CN", width: int = 1280, height: int = 860
) -> Any:
    context = browser.new_context(viewport={"width": width, "height": height}, locale=locale)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))

    def console(message: Any) -> None:
        # 401/404 answers are logged by Chromium as failed loads; those are the API at work.
        if message.type == "error" and "Failed to load resource" not in message.text:
            errors.append(message.text)  # e.g. a Content-Security-Policy refusal

    page.on("console", console)
    page.errors = errors
    page.goto(url)
    page.wait_for_selector("body[data-ready=yes]", timeout=WAIT_MS)
    return page


def send(page: Any, text: str) -> dict[str, Any]:
    """Type ``text``, press Enter, wait for the streamed answer and for the page to show its jobs done."""
    answers_before = page.locator(".message.assistant").count()
    page.fill("#message-input", text)
    page.press("#message-input", "Enter")
    answer = page.locator(".message.assistant").nth(answers_before)
    answer.wait_for(timeout=WAIT_MS)
    page.wait_for_selector(
        f".message.assistant >> nth={answers_before} >> xpath=self::*[@data-state='done']",
        timeout=WAIT_MS,
    )
    seq = int(answer.get_attribute("data-seq"))
    page.wait_for_selector(
        f"body[data-last-seq='{seq}'][data-jobs=idle][data-sending=no]", timeout=WAIT_MS
    )
    return {
        "seq": seq,
        "deltas": int(answer.get_attribute("data-deltas")),
        "text": answer.locator(".message-text").inner_text(),
        "layers": layer_tokens(page),
        "total": int(page.get_attribute("#context-caption", "data-total")),
    }


def layer_tokens(page: Any) -> dict[str, tuple[int, int]]:
    """``{layer: (used, allocated)}`` as the inspector draws it."""
    rows = page.eval_on_selector_all(
        "#layers .layer",
        "rows => rows.map(r => [r.dataset.layer, +r.dataset.used, +r.dataset.allocated])",
    )
    return {name: (used, allocated) for name, used, allocated in rows}


def received(layers: dict[str, tuple[int, int]]) -> set[str]:
    """The layers that held something (used > 0)."""
    return {name for name, (used, _) in layers.items() if used > 0}


def bar_widths(page: Any) -> dict[str, float]:
    """Rendered width in pixels of each layer's token bar."""
    rows = page.eval_on_selector_all(
        "#layers .layer",
        "rows => rows.map(r => [r.dataset.layer, r.querySelector('.layer-fill').getBoundingClientRect().width])",
    )
    return dict(rows)


def session_json(server: LiveServer, session_id: str, key: str | None = None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    response = httpx.get(
        f"{server.url}/v1/sessions/{session_id}", headers=headers, params={"limit": 100}
    )
    response.raise_for_status()
    data: dict[str, Any] = response.json()["data"]
    return data


def tiny_png() -> bytes:
    """A valid 2×2 red PNG, built here (no image files in the repository)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    rows = b"".join(b"\x00" + b"\xff\x00\x00" * 2 for _ in range(2))
    header = struct.pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


# -- the conversation of the issue ---------------------------------------------------------


def test_chinese_chat_streams_and_the_inspector_follows(browser: Any, server: LiveServer) -> None:
    page = open_page(browser, f"{server.url}/#session=web-zh")
    assert page.inner_text("#inspector-title") == "模型看到了什么"
    assert page.locator("#constraints li").count() == 0

    first = send(page, "我不吃辣，预算五十以内")
    # The answer arrived as several SSE delta events, and what streamed is what was stored.
    assert first["deltas"] > 1
    stored = session_json(server, "web-zh")
    assert first["text"] == stored["turns"][-1]["content"]
    # The first turn's model got the system prompt and the message; any other layer is drawn
    # empty, with the budget it was allotted.
    assert received(first["layers"]) == {"system", "current"}
    for name in set(first["layers"]) - received(first["layers"]):
        assert "empty-layer" in (
            page.get_attribute(f"#layers .layer[data-layer={name}]", "class") or ""
        )
    # Constraint extraction runs after the answer; the page polled until it landed.
    spice = page.locator("#constraints li[data-key=spice]")
    assert spice.get_attribute("data-source-seq") == "1"
    assert "不吃辣" in spice.inner_text()
    assert "来自第 1 轮" in spice.inner_text()

    second = send(page, "推荐一家餐厅")
    # The pinned constraints and the first exchange now reach the model: new layers, more tokens.
    assert {"system", "constraints", "recent", "current"} <= received(second["layers"])
    assert second["total"] > first["total"]
    for used, allocated in second["layers"].values():
        assert 0 <= used <= allocated
    widths = bar_widths(page)
    # The offline responder's answers are engine notices, never history: the recent window
    # holds the user's first message only, so it is drawn but smaller than the system prompt.
    assert widths["recent"] > 0 and widths["system"] > 0

    third = send(page, "那家店在哪？")
    assert third["layers"]["recent"][0] > second["layers"]["recent"][0]
    assert bar_widths(page)["recent"] >= widths["recent"]
    # The follow-up: the original beside what the model was sent.
    assert page.inner_text("#original-message") == "那家店在哪？"
    if page.get_attribute("#rewrite-card", "data-rewritten") == "yes":
        assert page.inner_text("#standalone-message") not in ("", "那家店在哪？")

    # The timeline has one cell per stored turn; the constraint's source is marked, this turn outlined.
    assert page.locator("#timeline .cell").count() == third["seq"] == 6
    assert "pinned" in (page.get_attribute("#timeline .cell[data-seq='1']", "class") or "")
    assert "current" in (page.get_attribute("#timeline .cell[data-seq='5']", "class") or "")
    assert page.locator("#jobs li[data-job=constraints]").count() == 1

    # The storage card measures what the session keeps, by kind of record, when asked.
    page.click("#storage-button")
    page.wait_for_selector("#storage-table", timeout=WAIT_MS)
    stored_kinds = page.eval_on_selector_all("#storage-table tbody tr", "rows => rows.map(r => r.dataset.kind)")
    assert {"turns", "traces"} <= set(stored_kinds)
    assert page.inner_text("#storage-table tr[data-kind=turns] th") == "对话轮次"
    assert "3 轮" in page.inner_text("#storage-total")

    # A preview of the next message lists what each layer holds, so in-context turns are outlined.
    page.fill("#message-input", "还有别的吗")
    page.click("#preview-button")
    page.wait_for_selector("#context-source.preview", timeout=WAIT_MS)
    assert page.locator("#timeline .cell.in-context").count() >= 2
    assert page.locator("details.layer-details").count() >= 2
    assert page.errors == []


def test_images_go_as_data_urls(browser: Any, server: LiveServer, tmp_path: Path) -> None:
    picture = tmp_path / "red.png"
    picture.write_bytes(tiny_png())
    page = open_page(browser, f"{server.url}/#session=web-image")
    page.set_input_files("#image-input", str(picture))
    page.wait_for_selector("#attachments img", timeout=WAIT_MS)
    turn = send(page, "这张图是什么颜色？")
    assert (
        page.locator(".message.user img")
        .first.get_attribute("src")
        .startswith("data:image/png;base64,")
    )
    assert page.locator("#attachments img").count() == 0
    user_turn = session_json(server, "web-image")["turns"][turn["seq"] - 2]
    assert user_turn["metadata"]["image_count"] == 1
    assert page.errors == []


def test_english_labels_and_the_language_toggle(browser: Any, server: LiveServer) -> None:
    page = open_page(browser, f"{server.url}/#session=web-en", locale="en-US")
    assert page.inner_text("#inspector-title") == "What the model sees"
    send(page, "I am vegetarian. Suggest a dinner.")
    assert page.inner_text("#layers .layer[data-layer=system] .layer-name") == "System"
    page.click("#lang-toggle")
    assert page.inner_text("#inspector-title") == "模型看到了什么"
    assert page.inner_text("#layers .layer[data-layer=system] .layer-name") == "系统指令"
    page.reload()
    page.wait_for_selector("body[data-ready=yes]", timeout=WAIT_MS)
    assert page.inner_text("#inspector-title") == "模型看到了什么"  # the choice is remembered
    # Reopening the session shows its history from the API.
    assert "I am vegetarian" in page.inner_text("#messages")
    assert page.errors == []


def test_with_auth_the_page_asks_for_the_key(browser: Any, auth_server: LiveServer) -> None:
    page = open_page(browser, f"{auth_server.url}/#session=web-auth")
    page.wait_for_selector("#key-dialog[open]", timeout=WAIT_MS)
    page.fill("#key-input", "key-acme")
    page.press("#key-input", "Enter")
    page.wait_for_selector("#key-dialog:not([open])", state="attached", timeout=WAIT_MS)
    assert page.evaluate("localStorage.getItem('contextmode.apiKey')") == "key-acme"
    send(page, "我对花生过敏")
    # Stored under the key's tenant: readable with that key, and only with it.
    assert session_json(auth_server, "web-auth", key="key-acme")["last_seq"] == 2
    assert httpx.get(f"{auth_server.url}/v1/sessions/web-auth").status_code == 401
    page.click("#key-button")
    page.fill("#key-input", "wrong-key")
    page.press("#key-input", "Enter")
    page.wait_for_selector("#key-dialog[open]", timeout=WAIT_MS)  # refused: asked again
    assert page.errors == []


def test_text_is_shown_as_text_and_inline_scripts_are_refused(
    browser: Any, server: LiveServer
) -> None:
    page = open_page(browser, f"{server.url}/#session=web-markup")
    markup = '<b>粗体</b><img src=x onerror="window.pwned=1">'
    send(page, markup)
    assert page.inner_text("#messages .message.user .message-text") == markup
    assert page.locator("#messages b, #messages img").count() == 0
    assert page.inner_text("#original-message") == markup
    # Even a script that got into the page would not run: the policy allows none inline.
    with page.expect_console_message(
        lambda m: "Content Security Policy" in m.text, timeout=WAIT_MS
    ):
        page.evaluate(
            "() => { const s = document.createElement('script');"
            " s.textContent = 'window.pwned = 1'; document.body.append(s); }"
        )
    assert page.evaluate("window.pwned") is None


def test_panes_side_by_side_on_a_laptop_and_stacked_on_a_phone(
    browser: Any, server: LiveServer
) -> None:
    wide = open_page(browser, f"{server.url}/#session=web-layout")
    chat, inspector = (
        wide.locator(".chat").bounding_box(),
        wide.locator(".inspector").bounding_box(),
    )
    assert inspector["x"] >= chat["x"] + chat["width"] and abs(inspector["y"] - chat["y"]) < 1
    narrow = open_page(browser, f"{server.url}/#session=web-layout", width=390, height=844)
    chat, inspector = (
        narrow.locator(".chat").bounding_box(),
        narrow.locator(".inspector").bounding_box(),
    )
    assert inspector["y"] >= chat["y"] + chat["height"]
    assert chat["width"] <= 390 and inspector["width"] <= 390
    # Nothing sticks out sideways on a phone.
    assert narrow.evaluate("document.documentElement.scrollWidth") <= 390


def test_a_streaming_model_shows_text_as_it_comes_and_failures_show(
    browser: Any, model_server: tuple[LiveServer, GatedModel]
) -> None:
    server, model = model_server
    page = open_page(browser, f"{server.url}/#session=web-model")
    page.fill("#message-input", "介绍一下你自己")
    page.press("#message-input", "Enter")
    # The first delta is on screen while the model is still answering (it waits for the gate).
    streaming = page.locator(".message.assistant[data-state=streaming] .message-text")
    streaming.filter(has_text="第一段").wait_for(timeout=WAIT_MS)
    assert page.is_disabled("#send-button")
    assert page.inner_text("#layers .layer[data-layer=current] .layer-tokens")  # context came first
    model.gate.set()
    done = page.locator(".message.assistant[data-state=done] .message-text")
    done.wait_for(timeout=WAIT_MS)
    assert done.inner_text() == "第一段，第二段。"

    page.fill("#message-input", "这次会出错吗")
    page.press("#message-input", "Enter")
    failed = page.locator(".message.assistant[data-state=error]")
    failed.wait_for(timeout=WAIT_MS)
    assert "说到一半" in failed.inner_text()
    assert "upstream closed the stream" in failed.inner_text()
    page.wait_for_selector("body[data-sending=no][data-last-seq='4']", timeout=WAIT_MS)
    # The half answer was stored as partial (seed 000); reopening the session says so.
    page.reload()
    page.wait_for_selector("body[data-ready=yes]", timeout=WAIT_MS)
    assert "（回答未完成）" in page.inner_text("#turn-4")
    assert page.errors == []


def test_with_an_openai_compatible_model(browser: Any, openai_server: LiveServer) -> None:
    page = open_page(browser, f"{openai_server.url}/#session=web-openai")
    turn = send(page, "杭州有什么好吃的？")
    assert turn["text"] == "Stub answer to: 杭州有什么好吃的？"
    assert turn["deltas"] > 1
    follow_up = send(page, "那家店几点开门？")
    assert follow_up["text"].startswith("Stub answer to: ")
    assert {"system", "recent", "current"} <= received(follow_up["layers"])
    assert page.errors == []


def test_the_page_polls_while_jobs_are_pending(
    browser: Any, jobs_server: tuple[LiveServer, GatedExtractor]
) -> None:
    server, extractor = jobs_server
    page = open_page(browser, f"{server.url}/#session=web-jobs")
    page.fill("#message-input", "我不吃辣")
    page.press("#message-input", "Enter")
    page.locator(".message.assistant[data-state=done]").wait_for(timeout=WAIT_MS)
    # One unit of background work per session (`memory`: emotion, constraints, summary) is pending.
    page.locator("#jobs li[data-job=memory].pending .badge").wait_for(timeout=WAIT_MS)
    assert page.locator("#constraints li").count() == 0
    # The job is still running: the page keeps asking (three more loads of the session)...
    for _ in range(3):
        with page.expect_request(lambda r: "/v1/sessions/web-jobs?" in r.url, timeout=WAIT_MS):
            pass
    # ...and shows the constraint once the job is done, with nobody touching the page.
    extractor.gate.set()
    page.locator("#constraints li[data-key=spice]").wait_for(timeout=WAIT_MS)
    page.wait_for_selector("body[data-jobs=idle]", timeout=WAIT_MS)
    assert page.locator("#jobs li.pending").count() == 0
    # A job that fails is shown as failed, with its error.
    send(page, "系统故障了吗？")
    failed = page.locator("#jobs li[data-job=constraints].failed")
    assert "extractor unavailable" in failed.inner_text()
    assert page.errors == []


# -- the screenshots in docs/img ------------------------------------------------------------


def test_screenshots(browser: Any, server: LiveServer, tmp_path: Path) -> None:
    """A longer conversation, so the summary, dropped turns and the rewrite all show."""
    update = os.environ.get("CONTEXTMODE_UPDATE_SCREENSHOT") == "1"
    out = DOCS_IMG if update else tmp_path
    page = open_page(browser, f"{server.url}/#session=web-demo")
    for text in [
        "我不吃辣，预算五十以内",
        "推荐一家餐厅",
        "那家店在哪？",
        "还有别的推荐吗",
        "第二家店在哪",
        "那它几点关门？",
        "周末也开吗？",
    ]:
        send(page, text)
    session = session_json(server, "web-demo")
    assert session["stats"]["summary_covers_seq"] > 0
    covered = page.locator("#timeline .cell.covered").count()
    assert covered == session["stats"]["summary_covers_seq"]
    page.screenshot(path=str(out / "inspector.png"))
    page.set_viewport_size({"width": 390, "height": 844})
    page.evaluate("document.querySelector('#messages').scrollTop = 1e9")  # the newest turn in view
    page.screenshot(path=str(out / "inspector-mobile.png"), full_page=True)
    for name in ("inspector.png", "inspector-mobile.png"):
        assert (out / name).read_bytes().startswith(b"\x89PNG")
    assert page.errors == []
