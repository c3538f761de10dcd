"""The inspector page as files and routes (no browser): served at ``/``, public API only, safe DOM use.

The page itself is driven in headless Chromium by ``test_web_browser.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastapi")

from contextmode.service import ServiceSettings, create_app
from contextmode.service.web import STATIC_DIR, WEB_HEADERS
from tests.service.test_service import make_engine

JS_FILES = sorted((STATIC_DIR / "js").glob("*.js"))


def make_app(tmp_path: Path, **settings: object) -> object:
    return create_app(make_engine(), ServiceSettings(image_dir=tmp_path / "images", **settings))  # type: ignore[arg-type]


def client(app: object) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://web.test")  # type: ignore[arg-type]


async def test_page_is_served_at_root_with_its_headers(tmp_path: Path) -> None:
    async with client(make_app(tmp_path)) as http:
        response = await http.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    for name, value in WEB_HEADERS.items():
        assert response.headers[name] == value
    assert '<script type="module" src="/static/js/app.js"></script>' in response.text
    assert 'href="/static/inspector.css"' in response.text


async def test_the_favicon_is_served_not_a_404(tmp_path: Path) -> None:
    async with client(make_app(tmp_path)) as http:
        response = await http.get("/favicon.ico")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("image/svg+xml")
    assert response.text.startswith("<svg")


async def test_every_asset_the_page_loads_is_served(tmp_path: Path) -> None:
    html = (STATIC_DIR / "index.html").read_text(encoding="utf-8")
    referenced = set(re.findall(r'(?:src|href)="(/static/[^"]+)"', html))
    # ES module imports: every "./x.js" that a script imports must exist and be served.
    for path in JS_FILES:
        for name in re.findall(r'from "\./([\w-]+\.js)"', path.read_text(encoding="utf-8")):
            referenced.add(f"/static/js/{name}")
    assert {
        "/static/inspector.css",
        "/static/js/app.js",
        "/static/js/api.js",
        "/static/js/inspector.js",
    } <= referenced
    async with client(make_app(tmp_path)) as http:
        for url in sorted(referenced):
            response = await http.get(url)
            assert response.status_code == 200, url
            expected = {"css": "text/css", "svg": "image/svg+xml"}.get(url.rsplit(".", 1)[-1], "javascript")
            assert expected in response.headers["content-type"], url
            assert (
                response.headers["content-security-policy"]
                == WEB_HEADERS["content-security-policy"]
            )
        missing = await http.get("/static/nope.js")
    assert missing.status_code == 404


async def test_page_routes_stay_out_of_the_api_schema(tmp_path: Path) -> None:
    async with client(make_app(tmp_path)) as http:
        schema = (await http.get("/openapi.json")).json()
    assert "/" not in schema["paths"]
    assert not any(path.startswith("/static") for path in schema["paths"])


async def test_page_needs_no_key_but_the_api_does(tmp_path: Path) -> None:
    # With auth on, the page itself loads (it then asks for the key); the API stays closed.
    app = make_app(tmp_path, api_keys={"secret-key": "acme"})
    async with client(app) as http:
        assert (await http.get("/")).status_code == 200
        assert (await http.get("/static/js/app.js")).status_code == 200
        assert (await http.get("/v1/sessions")).status_code == 401
        ok = await http.get("/v1/sessions", headers={"Authorization": "Bearer secret-key"})
    assert ok.status_code == 200


async def test_page_calls_only_public_api_routes(tmp_path: Path) -> None:
    """No private endpoint: every /v1 path in the JavaScript is one the OpenAPI schema documents."""
    async with client(make_app(tmp_path)) as http:
        documented = set((await http.get("/openapi.json")).json()["paths"])
    used: set[str] = set()
    for path in JS_FILES:
        for literal in re.findall(r'[`"](/v1/[^`"?]*)', path.read_text(encoding="utf-8")):
            # ${turn} is the exchange number; any other ${…} is the session id.
            literal = literal.replace("${turn}", "{turn}")
            used.add(re.sub(r"\$\{[^}]+\}", "{session_id}", literal))
    assert used == {
        "/v1/sessions",
        "/v1/sessions/{session_id}",
        "/v1/sessions/{session_id}/context",
        "/v1/sessions/{session_id}/messages",
        "/v1/sessions/{session_id}/storage",
        "/v1/sessions/{session_id}/turns/{turn}/context",
    }
    assert used <= documented


def test_scripts_never_parse_text_as_html() -> None:
    # Model answers and user text are shown with text nodes only (and the CSP forbids inline scripts).
    for path in [*JS_FILES, STATIC_DIR / "index.html"]:
        text = path.read_text(encoding="utf-8")
        for sink in (
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
            "new Function",
        ):
            assert sink not in text, f"{path.name} uses {sink}"
        assert "http://" not in text and "https://" not in text, (
            f"{path.name} loads something remote"
        )


def test_both_languages_have_the_same_labels() -> None:
    source = (STATIC_DIR / "js" / "i18n.js").read_text(encoding="utf-8")
    zh_block, en_block = source.split("\n  en: {", 1)
    keys = lambda block: set(re.findall(r"^\s{4}(\w+):", block, flags=re.M))  # noqa: E731
    assert keys(zh_block) == keys(en_block.split("\n};", 1)[0])
    assert len(keys(zh_block)) > 40


def test_static_files_ship_inside_the_package() -> None:
    # Hatch packages src/contextmode whole, so files beside the modules go into the wheel.
    import contextmode

    package = Path(contextmode.__file__).parent
    assert STATIC_DIR.is_relative_to(package)
    for name in ("index.html", "inspector.css", "js/app.js"):
        assert (STATIC_DIR / name).is_file()
