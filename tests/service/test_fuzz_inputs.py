"""Named bad inputs, each with its expected 4xx envelope and a clear message: invalid JSON,
wrong types, huge messages, invalid UTF-8, control characters, deep nesting, bad and
oversize images, unknown sessions, hostile session ids. After each: the stored data is
exactly as before and no temp file is left. Limits come from settings (configurable).
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from contextmode.types import SessionKey

pytest.importorskip("fastapi")

from contextmode.api import build_engine
from contextmode.engine import Engine
from contextmode.service import ServiceSettings, create_app
from contextmode.store.sqlite import SQLiteStore
from contextmode.testing.counters import CharTokenCounter
from contextmode.testing.models import FunctionModel

SID = "kept"
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 40
LIMITS: dict[str, Any] = {"max_message_chars": 1000, "max_body_bytes": 64 * 1024, "max_images": 2, "max_image_bytes": 2048}


def url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def body(**fields: Any) -> bytes:
    return json.dumps({"message": "hi", **fields}, ensure_ascii=False).encode()


M = f"/v1/sessions/{SID}/messages"
# name → (method, path, raw body, extra headers, expected code, words the message must contain)
CASES: dict[str, tuple[str, str, bytes | None, dict[str, str], int, str]] = {
    "invalid JSON (truncated)": ("POST", M, b'{"message": "hi"', {}, 40001, "invalid JSON"),
    "invalid JSON (garbage)": ("POST", M, b"not json at all", {}, 40001, "invalid JSON"),
    "empty body": ("POST", M, b"", {}, 40001, "body"),
    "JSON array instead of object": ("POST", M, b"[1, 2]", {}, 40001, "body"),
    "message of wrong type (int)": ("POST", M, b'{"message": 5}', {}, 40001, "message"),
    "message of wrong type (object)": ("POST", M, b'{"message": {"a": 1}}', {}, 40001, "message"),
    "message empty": ("POST", M, b'{"message": ""}', {}, 40005, "empty"),
    "message only whitespace": ("POST", M, b'{"message": " \\n\\t "}', {}, 40005, "empty"),
    "stream as a string": ("POST", M, b'{"message": "hi", "stream": "true"}', {}, 40001, "stream"),
    "stream of wrong type": ("POST", M, body(stream="yes please"), {}, 40001, "stream"),
    "unknown mode": ("POST", M, body(mode="telepathic"), {}, 40001, "mode"),
    "unknown field": ("POST", M, body(admin=True), {}, 40001, "admin"),
    "huge message (chars)": ("POST", M, body(message="长" * 1001), {}, 40002, "1000"),
    "huge body (bytes)": ("POST", M, body(message="x" * 70_000), {}, 41301, "larger than"),
    "huge body (no content-length)": ("POST", M, None, {"x-stream-body": "1"}, 41301, "larger than"),
    "invalid UTF-8 body": ("POST", M, b'{"message": "\xff\xfe\xfd"}', {}, 40001, "UTF-8"),
    "lone surrogate escape": ("POST", M, b'{"message": "\\ud800"}', {}, 40001, "message"),
    "NUL character": ("POST", M, body(message="a\x00b"), {}, 40001, "U+0000"),
    "escape sequence (ESC)": ("POST", M, body(message="\x1b[31mred"), {}, 40001, "U+001B"),
    "DEL character": ("POST", M, body(message="a\x7f"), {}, 40001, "U+007F"),
    "deeply nested (20,000)": ("POST", M, b'{"message": ' + b"[" * 20_000 + b"]" * 20_000 + b"}", {}, 40001, "nested"),
    "deeply nested (images)": ("POST", M, b'{"message": "a", "images": ' + b"[" * 3000 + b"]" * 3000 + b"}", {}, 40001, "nested"),
    "image not base64": ("POST", M, body(images=["data:image/png;base64,@@@@"]), {}, 40003, "base64"),
    "image not a data URL": ("POST", M, body(images=["https://evil.example/x.png"]), {}, 40003, "data URL"),
    "image not an image": ("POST", M, body(images=[url(b"%PDF-1.7")]), {}, 40003, "not a PNG"),
    "image type mismatch": ("POST", M, body(images=[url(PNG, "image/gif")]), {}, 40003, "declared"),
    "image oversize": ("POST", M, body(images=[url(PNG + b"\x00" * 3000)]), {}, 40003, "limit"),
    "too many images": ("POST", M, body(images=[url(PNG)] * 3), {}, 40003, "at most 2"),
    "image of wrong type (int)": ("POST", M, body(images=[5]), {}, 40001, "images"),
    "unknown session (read)": ("GET", "/v1/sessions/nobody", None, {}, 40401, "nobody"),
    "unknown session (delete)": ("DELETE", "/v1/sessions/nobody", None, {}, 40401, "nobody"),
    # %2F decodes to a slash before routing: no route has that shape
    "session id ../x": ("GET", "/v1/sessions/..%2Fx", None, {}, 40400, "Not Found"),
    "session id ../x (message)": ("POST", "/v1/sessions/..%2Fx/messages", body(), {}, 40400, "Not Found"),
    "session id %2e%2e%2f": ("GET", "/v1/sessions/%252e%252e%252fx", None, {}, 40004, "invalid session id"),
    "session id ..": ("GET", "/v1/sessions/%2e%2e", None, {}, 40004, "invalid session id"),
    "session id SQL": ("DELETE", "/v1/sessions/a%3BDROP%20TABLE%20turns", None, {}, 40004, "invalid session id"),
    "session id quote": ("POST", "/v1/sessions/x'%20OR%20'1'%3D'1/messages", body(), {}, 40004, "invalid session id"),
    "session id unicode": ("POST", "/v1/sessions/%E4%BC%9A%E8%AF%9D/messages", body(), {}, 40004, "invalid session id"),
    "session id 1000 chars": ("GET", "/v1/sessions/" + "a" * 1000, None, {}, 40004, "invalid session id"),
    "session id NUL": ("GET", "/v1/sessions/a%00b", None, {}, 40004, "invalid session id"),
    "session id invalid UTF-8": ("GET", "/v1/sessions/%ff%fe", None, {}, 40004, "invalid session id"),
    "proxy session id SQL": (
        "POST", "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode(),
        {"x-session-id": "a;DROP TABLE" * 10}, 40004, "invalid session id",  # shorter ones are mapped (b32:)
    ),
    "proxy without session": (
        "POST", "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode(),
        {}, 40001, "X-Session-Id",
    ),
    "proxy content part unknown": (
        "POST", "/v1/chat/completions",
        json.dumps({"user": SID, "messages": [{"role": "user", "content": [{"type": "audio"}]}]}).encode(),
        {}, 40001, "audio",
    ),
    "proxy invalid JSON": ("POST", "/v1/chat/completions", b"{", {}, 40001, "invalid JSON"),
    "query limit not a number": ("GET", "/v1/sessions?limit=lots", None, {}, 40001, "limit"),
    "query limit out of range": ("GET", f"/v1/sessions/{SID}?limit=100000", None, {}, 40001, "limit"),
    "context without message": ("GET", f"/v1/sessions/{SID}/context", None, {}, 40001, "message"),
    "context with NUL": ("GET", f"/v1/sessions/{SID}/context?message=a%00", None, {}, 40001, "U+0000"),
    "unknown route": ("GET", "/v1/secrets", None, {}, 40400, "Not Found"),
    "wrong method": ("PUT", f"/v1/sessions/{SID}", None, {}, 40500, "Method Not Allowed"),
}


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Engine, Path]]:
    store = SQLiteStore(tmp_path / "inputs.db")
    engine = build_engine(store=store, model=FunctionModel(lambda m: "ok"), counter=CharTokenCounter())
    image_dir = tmp_path / "img"
    app = create_app(engine, ServiceSettings(image_dir=image_dir, **LIMITS))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        assert (await client.post(M, json={"message": "我不吃辣"})).status_code == 200
        await engine.drain()
        yield client, engine, image_dir
    await engine.close()


async def stored(engine: Engine) -> Any:
    store = engine.store
    sessions = await store.list_sessions("local", limit=100)
    out = []
    for info in sessions:
        turns = await store.turns(SessionKey("local", info.session_id), from_seq=1, to_seq=info.last_seq)
        out.append((info.session_id, [(t.seq, t.content) for t in turns], info.summary_version, info.constraints_version))
    return out


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    for i in range(0, len(data), 8192):
        yield data[i : i + 8192]


@pytest.mark.parametrize("name", list(CASES))
async def test_bad_input_gets_a_clear_4xx_and_changes_nothing(
    world: tuple[httpx.AsyncClient, Engine, Path], name: str
) -> None:
    client, engine, image_dir = world
    method, path, raw, headers, code, words = CASES[name]
    before = await stored(engine)
    content: Any = raw
    if headers.pop("x-stream-body", None):
        content = _chunks(body(message="x" * 70_000))  # chunked: the limit is enforced while reading
    response = await client.request(
        method, path, content=content, headers={"content-type": "application/json", **headers}
    )
    assert response.status_code == code // 100, response.text[:300]
    payload = response.json()
    if path.startswith("/v1/chat/"):
        error = payload["error"]
        assert error["contextmode_code"] == code and words in error["message"], error
    else:
        assert payload["code"] == code and words in payload["msg"], payload
    await engine.drain()
    assert await stored(engine) == before
    assert not image_dir.exists() or not list(image_dir.iterdir())


def test_limits_come_from_the_environment() -> None:
    settings = ServiceSettings.from_env(
        {
            "CONTEXTMODE_MAX_MESSAGE_CHARS": "10",
            "CONTEXTMODE_MAX_BODY_BYTES": "2048",
            "CONTEXTMODE_MAX_IMAGES": "1",
            "CONTEXTMODE_MAX_IMAGE_BYTES": "100",
        }
    )
    assert (settings.max_message_chars, settings.max_body_bytes, settings.max_images, settings.max_image_bytes) == (
        10, 2048, 1, 100,
    )
    docs = (Path(__file__).parents[2] / "docs" / "service.md").read_text()
    for name in ("CONTEXTMODE_MAX_MESSAGE_CHARS", "CONTEXTMODE_MAX_BODY_BYTES", "CONTEXTMODE_MAX_IMAGES",
                 "CONTEXTMODE_MAX_IMAGE_BYTES"):
        assert name in docs
