"""The inspector page: a chat pane and a view of what the model received, served at ``/``.

The page is static (HTML, CSS and plain JavaScript under ``static/``) and talks
to the same public API as every other client: ``GET /v1/sessions``,
``GET /v1/sessions/{id}``, ``GET /v1/sessions/{id}/context`` and the SSE stream
of ``POST /v1/sessions/{id}/messages``. Nothing here reads the engine, so the
page shows exactly what an API user can see. See docs/web.md.
"""

from __future__ import annotations

import os
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response
from starlette.staticfiles import PathLike
from starlette.types import Scope

__all__ = ["STATIC_DIR", "WEB_HEADERS", "mount_web"]

STATIC_DIR = Path(__file__).with_name("static")
"""The page's files (shipped in the wheel as package data)."""

WEB_HEADERS = {
    # The page renders model output and user text; it only ever sets textContent,
    # and the policy makes sure no injected script or remote resource could run anyway.
    "content-security-policy": (
        "default-src 'self'; img-src 'self' data: blob:; style-src 'self'; script-src 'self'; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    # The page is small and changes with the package: always revalidate (ETag) rather than cache stale JS.
    "cache-control": "no-cache",
}
"""Headers sent with the page and its assets."""


class _StaticFiles(StaticFiles):
    """`StaticFiles` that adds `WEB_HEADERS` to every file it serves."""

    def file_response(
        self, full_path: PathLike, stat_result: os.stat_result, scope: Scope, status_code: int = 200
    ) -> Response:
        response = super().file_response(full_path, stat_result, scope, status_code)
        response.headers.update(WEB_HEADERS)
        return response


def mount_web(app: FastAPI, *, path: str = "/") -> None:
    """Serve the inspector page at ``path`` and its assets under ``/static``.

    The routes are left out of the OpenAPI schema: they are not part of the API.
    """
    index = STATIC_DIR / "index.html"

    @app.get(path, include_in_schema=False)
    async def inspector_page() -> FileResponse:
        return FileResponse(index, media_type="text/html; charset=utf-8", headers=WEB_HEADERS)

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> FileResponse:
        # Browsers ask for it whatever the page links; the page's own icon, not a 404.
        return FileResponse(STATIC_DIR / "favicon.svg", media_type="image/svg+xml", headers=WEB_HEADERS)

    app.mount("/static", _StaticFiles(directory=STATIC_DIR), name="web-static")
