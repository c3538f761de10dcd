"""Images at the boundary (seed 002): data URLs → temp files → always deleted, with clear errors."""

from __future__ import annotations

import base64
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from contextmode.errors import ModelError
from contextmode.service import create_app
from contextmode.service.codes import BadImage
from contextmode.service.images import ImageFiles, decode_images, sniff_image_type
from contextmode.testing.models import BrokenStream, FunctionModel
from contextmode.types import ChatMessage, SessionKey
from tests.service.test_service import (
    assert_error,
    client_for,
    make_engine,
    make_settings,
    sse_events,
)

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 40
JPEG = b"\xff\xd8\xff\xe0" + b"\x00" * 40
GIF = b"GIF89a" + b"\x00" * 40
WEBP = b"RIFF\x24\x00\x00\x00WEBPVP8 " + b"\x00" * 32


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def test_magic_bytes_decide_the_type() -> None:
    assert [sniff_image_type(x) for x in (PNG, JPEG, GIF, WEBP, b"%PDF-1.7")] == ["png", "jpeg", "gif", "webp", None]


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("https://example.com/cat.png", "remote URLs"),
        ("data:image/png;base64", "no comma"),
        ("data:image/png,abcd", "base64-encoded"),
        ("data:text/plain;base64,aGVsbG8=", "not an image"),
        ("data:image/png;base64,@@@@", "invalid base64"),
        (data_url(b"%PDF-1.7 not an image"), "not a PNG"),
        (data_url(JPEG, "image/png"), "declared"),
        (data_url(PNG * 100), "larger than the limit"),
    ],
)
def test_bad_images_are_refused_with_a_reason(tmp_path: Path, url: str, why: str) -> None:
    settings = make_settings(tmp_path, max_image_bytes=1024)
    with pytest.raises(BadImage, match=why):
        decode_images([url], settings)


def test_count_and_type_limits(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, max_images=2, allowed_image_types=("png",))
    with pytest.raises(BadImage, match="at most 2"):
        decode_images([data_url(PNG)] * 3, settings)
    with pytest.raises(BadImage, match="not accepted"):
        decode_images([data_url(GIF, "image/gif")], settings)
    decoded = decode_images([data_url(PNG), data_url(PNG, "image/png")], settings)
    files = ImageFiles.write(decoded, settings.image_dir)
    assert all(p.exists() and p.name.startswith("contextmode-img-") for p in files.paths)
    files.cleanup()
    files.cleanup()  # idempotent
    assert os.listdir(settings.image_dir) == []


async def test_images_reach_the_engine_as_files_and_are_deleted(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    seen: list[list[str]] = []

    def model(messages: Sequence[ChatMessage]) -> str:
        seen.append(sorted(os.listdir(settings.image_dir)))
        return "看到了"

    engine = make_engine(FunctionModel(model))
    urls = [data_url(PNG), data_url(JPEG, "image/jpeg"), data_url(WEBP, "image/webp")]
    async with client_for(create_app(engine, settings)) as c:
        r = await c.post("/v1/sessions/s1/messages", json={"message": "看图", "images": urls})
        assert r.json()["code"] == 0
        r = await c.post("/v1/sessions/s1/messages", json={"message": "再看", "images": urls[:1], "stream": True})
        assert sse_events(r.text)[-2]["type"] == "done"
    assert [len(names) for names in seen] == [3, 1]
    assert os.listdir(settings.image_dir) == []
    user = (await engine.store.turns(SessionKey("local", "s1")))[0]
    assert user.metadata["image_count"] == 3
    assert [i["type"] for i in user.metadata["images"]] == ["png", "jpeg", "webp"]
    assert all(i["path"].startswith(str(settings.image_dir)) for i in user.metadata["images"])


async def test_a_thousand_image_requests_leave_no_file_behind(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, max_image_bytes=4096, max_images=3)

    def model(messages: Sequence[ChatMessage]) -> object:
        text = messages[-1].content
        if "fail" in text:
            raise ModelError("upstream down")
        if "break" in text:
            return BrokenStream(chunks=["半"])
        return "ok"

    app = create_app(make_engine(FunctionModel(model)), settings)
    good = [data_url(PNG), data_url(GIF, "image/gif")]
    variants: list[tuple[dict[str, object], int]] = [
        ({"message": "good", "images": good}, 0),
        ({"message": "good stream", "images": good, "stream": True}, 0),
        ({"message": "fail", "images": good}, 50201),
        ({"message": "break", "images": good}, 50201),
        ({"message": "break stream", "images": good, "stream": True}, 0),
        ({"message": "bad base64", "images": [good[0], "data:image/png;base64,!!!"]}, 40003),
        ({"message": "wrong mime", "images": [good[0], data_url(b"%PDF-1.4", "image/png")]}, 40003),
        ({"message": "oversize", "images": [good[0], data_url(PNG + b"\x00" * 5000)]}, 40003),
        ({"message": "too many", "images": good * 2}, 40003),
        ({"message": "declared wrong", "images": [data_url(PNG, "image/gif")]}, 40003),
    ]
    codes: dict[int, int] = {}
    async with client_for(app) as c:
        for i in range(1000):
            body, expected = variants[i % len(variants)]
            r = await c.post(f"/v1/sessions/img{i % 20}/messages", json=body)
            if r.headers["content-type"].startswith("text/event-stream"):
                code = 0
            else:
                code = r.json()["code"]
            assert code == expected, (i, body["message"], r.text[:200])
            codes[code] = codes.get(code, 0) + 1
        await app.state.contextmode.engine.drain()
    assert codes == {0: 300, 50201: 200, 40003: 500}
    assert os.listdir(settings.image_dir) == []


async def test_bad_image_is_a_40003_envelope(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    async with client_for(create_app(make_engine(), settings)) as c:
        body = assert_error(
            await c.post("/v1/sessions/s1/messages", json={"message": "看", "images": ["data:image/png;base64,xx"]}), 40003
        )
        assert "image 1" in body["msg"]
        assert (await c.get("/v1/sessions")).json()["data"]["sessions"] == []  # nothing stored
