"""Cheap rejection first: the key before the body, a cap on keys and items counted while the
body arrives, and validation errors of a few hundred bytes however bad the body is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextmode.service import create_app
from contextmode.service.bodyscan import JsonShape
from contextmode.service.responses import MAX_ERROR_BYTES, validation_details
from tests.service.test_service import client_for, make_engine, make_settings

CHUNK = 65_536
URL = "/v1/sessions/s1/messages"


def _hostile(keys: int) -> bytes:
    return json.dumps({"message": "hi", **{f"k{i}": i for i in range(keys)}}).encode()


async def _call(app: Any, body: bytes, headers: dict[str, str]) -> tuple[int, bytes, int]:
    """Drive the ASGI app by hand: (status, response body, chunks of the request it read)."""
    chunks = [body[i : i + CHUNK] for i in range(0, len(body), CHUNK)]
    read = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal read
        if read < len(chunks):
            read += 1
            return {"type": "http.request", "body": chunks[read - 1], "more_body": read < len(chunks)}
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    raw_headers = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    raw_headers.append((b"content-type", b"application/json"))
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": URL, "raw_path": URL.encode(), "query_string": b"", "headers": raw_headers,
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80), "root_path": "", "state": {},
    }
    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    payload = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, payload, read


@pytest.fixture
def app(tmp_path: Path) -> Any:
    return create_app(make_engine(), make_settings(tmp_path, api_keys={"good-key": "t1"}))


async def test_a_request_without_a_valid_key_is_refused_before_its_body_is_read(app: Any) -> None:
    body = _hostile(200_000)
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        status, payload, read = await _call(app, body, headers)
        assert status == 401 and json.loads(payload)["code"] == 40101
        assert read == 0


async def test_a_body_with_too_many_keys_is_refused_after_its_first_chunks(app: Any) -> None:
    body = _hostile(300_000)
    status, payload, read = await _call(app, body, {"Authorization": "Bearer good-key"})
    assert status == 400
    envelope = json.loads(payload)
    assert envelope["code"] == 40001 and "keys and array items" in envelope["msg"]
    assert read < 10 < len(body) // CHUNK
    assert len(payload) <= MAX_ERROR_BYTES


async def test_many_unknown_keys_under_the_cap_get_one_short_error(tmp_path: Path) -> None:
    app = create_app(make_engine(), make_settings(tmp_path))
    async with client_for(app) as client:
        r = await client.post(URL, content=_hostile(5_000), headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["code"] == 40001
    assert "unknown field" in r.json()["msg"] and len(r.content) <= MAX_ERROR_BYTES


async def test_many_bad_messages_to_the_proxy_get_one_short_error(tmp_path: Path) -> None:
    app = create_app(make_engine(), make_settings(tmp_path))
    body = {"messages": [{"content": "x" * 100}] * 3000, "user": "s1"}
    async with client_for(app) as client:
        r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and "messages[0]" in r.json()["error"]["message"]
    assert len(r.content) <= MAX_ERROR_BYTES


def test_validation_details_stay_small_however_many_problems() -> None:
    key, msg, kind, value = "k" * 10_000, "m" * 10_000, "t" * 500, "x" * 10**5  # shared, not copied per error
    raw = [{"loc": ("body", key, i), "msg": msg, "type": kind, "input": value} for i in range(100_000)]
    msg, data = validation_details(raw)
    assert data["count"] == 100_000 and 1 <= len(data["errors"]) <= 5
    assert "99999 more problems" in msg
    assert len(json.dumps({"code": 40001, "msg": msg, "data": data}, ensure_ascii=False).encode()) <= MAX_ERROR_BYTES


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet=st.sampled_from('ab,:"\\{}[] 中\n')),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(alphabet='k,:"\\', max_size=4), inner, max_size=5),
    max_leaves=30,
)


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _separators(value: Any) -> int:
    if isinstance(value, dict):
        return (2 * len(value) - 1 if value else 0) + sum(_separators(v) for v in value.values())
    if isinstance(value, list):
        return max(len(value) - 1, 0) + sum(_separators(v) for v in value)
    return 0


@given(value=json_values, size=st.integers(min_value=1, max_value=9), ascii_only=st.booleans())
def test_the_running_count_equals_the_structure_for_any_chunking(value: Any, size: int, ascii_only: bool) -> None:
    body = json.dumps(value, ensure_ascii=ascii_only).encode()
    shape = JsonShape()
    for i in range(0, len(body), size):
        shape.feed(body[i : i + size])
    assert shape.separators == _separators(value)
    assert shape.deepest == _depth(value) and shape.depth == 0


async def test_a_deeply_nested_body_is_refused_at_the_edge(app: Any) -> None:
    body = b'{"message": "hi", "mode": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    status, payload, read = await _call(app, body, {"Authorization": "Bearer good-key"})
    assert status == 400 and "nested deeper than 32" in json.loads(payload)["msg"]
    assert read == 1


async def test_a_get_with_a_hostile_body_still_gets_the_page(tmp_path: Path) -> None:
    # The page's file response reads the body only to wait for the disconnect while it sends:
    # a GET's body is never checked, so nothing is raised after the response has started.
    app = create_app(make_engine(), make_settings(tmp_path))
    async with client_for(app) as client:
        for body in ("[" * 500 + "]" * 500, json.dumps({str(i): i for i in range(20_000)})):
            page = await client.request("GET", "/", content=body, headers={"content-type": "application/json"})
            assert page.status_code == 200 and "<html" in page.text.lower()
