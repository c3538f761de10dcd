"""Images at the boundary: base64 data URLs in, temp file paths inside, always deleted.

`decode_images` checks every data URL (count, base64, size, type by magic
bytes) before anything touches the disk; `ImageFiles.write` then writes them
to ``NamedTemporaryFile(delete=False, prefix="contextmode-img-")`` files in the
service's dedicated folder, and `ImageFiles.cleanup` (idempotent) deletes them.
The routes call ``cleanup`` in a ``finally`` — for a streamed answer when the
stream ends or the client goes away.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..types import ImageRef
from .codes import BadImage
from .settings import ServiceSettings

__all__ = ["DecodedImage", "ImageFiles", "decode_images", "sniff_image_type"]

TEMP_PREFIX = "contextmode-img-"

_SUFFIX = {"png": ".png", "jpeg": ".jpg", "gif": ".gif", "webp": ".webp"}


def sniff_image_type(data: bytes) -> str | None:
    """``png``, ``jpeg``, ``gif`` or ``webp`` from the file's magic bytes, else ``None``."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if data.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "gif"
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return None


@dataclass(frozen=True, kw_only=True)
class DecodedImage:
    """An image that passed every check, still in memory."""

    kind: str
    """``png``, ``jpeg``, ``gif`` or ``webp`` (from the magic bytes)."""
    data: bytes


def _decode_one(index: int, url: str, settings: ServiceSettings) -> DecodedImage:
    where = f"image {index + 1}"
    if not isinstance(url, str) or not url.startswith("data:"):
        raise BadImage(f"{where}: expected a data URL (data:image/png;base64,...); remote URLs are not fetched")
    header, sep, payload = url.partition(",")
    if not sep:
        raise BadImage(f"{where}: malformed data URL (no comma)")
    params = header[5:].split(";")
    declared = params[0].strip().lower()
    if "base64" not in (p.strip().lower() for p in params[1:]):
        raise BadImage(f"{where}: the data URL must be base64-encoded (';base64,')")
    if not declared.startswith("image/"):
        raise BadImage(f"{where}: MIME type {declared or '(none)'!r} is not an image")
    # Reject before decoding: base64 is 4 characters per 3 bytes.
    limit = settings.max_image_bytes
    if len(payload) > (limit + 2) // 3 * 4 + 4:
        raise BadImage(f"{where}: larger than the limit of {limit} bytes")
    try:
        data = base64.b64decode(payload.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise BadImage(f"{where}: invalid base64") from None
    if not data:
        raise BadImage(f"{where}: empty image")
    if len(data) > limit:
        raise BadImage(f"{where}: {len(data)} bytes, larger than the limit of {limit} bytes")
    kind = sniff_image_type(data)
    if kind is None:
        raise BadImage(f"{where}: the content is not a PNG, JPEG, GIF or WebP image")
    if kind not in settings.allowed_image_types:
        raise BadImage(f"{where}: {kind} images are not accepted (allowed: {', '.join(settings.allowed_image_types)})")
    if declared.removeprefix("image/").replace("jpg", "jpeg") != kind:
        raise BadImage(f"{where}: declared {declared!r} but the content is {kind}")
    return DecodedImage(kind=kind, data=data)


def decode_images(urls: Sequence[str], settings: ServiceSettings) -> list[DecodedImage]:
    """Check and decode every data URL; raise `BadImage` naming the first bad one."""
    if len(urls) > settings.max_images:
        raise BadImage(f"{len(urls)} images sent; at most {settings.max_images} per message")
    return [_decode_one(i, url, settings) for i, url in enumerate(urls)]


@dataclass
class ImageFiles:
    """Temp files holding a request's images; `cleanup` deletes them (safe to call twice)."""

    paths: list[Path] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    """Bytes per image."""

    @classmethod
    def write(cls, images: Sequence[DecodedImage], folder: Path) -> ImageFiles:
        """Write ``images`` to temp files in ``folder``; on any failure delete what was written."""
        files = cls()
        if not images:
            return files
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for image in images:
                with tempfile.NamedTemporaryFile(
                    delete=False, prefix=TEMP_PREFIX, suffix=_SUFFIX[image.kind], dir=folder
                ) as handle:
                    files.paths.append(Path(handle.name))
                    handle.write(image.data)
                files.kinds.append(image.kind)
                files.sizes.append(len(image.data))
        except BaseException:
            files.cleanup()
            raise
        return files

    def cleanup(self) -> None:
        """Delete every file (missing ones are fine)."""
        while self.paths:
            path = self.paths.pop()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def refs(self) -> tuple[ImageRef, ...]:
        """What the user turn records about its images (the paths stop existing after the turn)."""
        return tuple(
            ImageRef(path=str(p), type=k, bytes=n) for p, k, n in zip(self.paths, self.kinds, self.sizes, strict=True)
        )
