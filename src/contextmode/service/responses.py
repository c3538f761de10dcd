"""Error responses in the caller's shape, written once for the app, the routes and replays.

Under ``/v1/chat/completions``, ``/v1/responses`` and ``/v1/models`` an error takes OpenAI's shape
``{"error": {...}}`` (what the openai SDK parses), under ``/v1/messages``
Anthropic's ``{"type": "error", "error": {...}}``; everywhere else it is the
``{code, msg, data}`` envelope.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence

from starlette.responses import JSONResponse  # fastapi re-exports it; the MCP server has no fastapi

from ..errors import ModelRateLimited
from ..types import JsonObject, JsonValue
from .anthropic_wire import anthropic_error_body
from .codes import ErrorCode, code_for_exception, http_status, public_message

__all__ = [
    "ANTHROPIC_PATHS",
    "MAX_ERROR_BYTES",
    "OPENAI_PATHS",
    "error_response",
    "exception_response",
    "openai_error_body",
    "validation_details",
]

OPENAI_PATHS = ("/v1/chat/", "/v1/models", "/v1/responses")
ANTHROPIC_PATHS = ("/v1/messages",)

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_exceeded",
}


def openai_error_body(code: int, name: str, message: str, data: JsonValue = None) -> JsonObject:
    """OpenAI's error shape, with the envelope code (and any ``data``) alongside."""
    status = code // 100
    kind = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    error: JsonObject = {"message": message, "type": kind, "param": None, "code": name, "contextmode_code": code}
    if data is not None:
        error["contextmode_data"] = data
    return {"error": error}


def error_response(path: str, row: ErrorCode, msg: str, data: JsonValue = None) -> JSONResponse:
    """The error ``row`` as the response for ``path`` (envelope, or OpenAI's or Anthropic's shape)."""
    status = http_status(row.code)
    headers = {"www-authenticate": "Bearer"} if status == 401 else None
    if path.startswith(OPENAI_PATHS):
        return JSONResponse(openai_error_body(row.code, row.name, msg, data), status_code=status, headers=headers)
    if path.startswith(ANTHROPIC_PATHS):
        return JSONResponse(anthropic_error_body(row.code, row.name, msg, data), status_code=status, headers=headers)
    return JSONResponse({"code": row.code, "msg": msg, "data": data}, status_code=status, headers=headers)


def exception_response(path: str, exc: BaseException, data: JsonValue = None) -> JSONResponse:
    """``exc`` as an error response for ``path`` (public message only); a rate-limited or
    overloaded model endpoint's wait is passed on as ``retry-after`` (and ``retry-after-ms``),
    the headers both SDKs' retries honour."""
    row = code_for_exception(exc)
    response = error_response(path, row, public_message(exc, row), data)
    if isinstance(exc, ModelRateLimited) and exc.retry_after is not None:
        response.headers["retry-after"] = str(max(1, math.ceil(exc.retry_after)))
        response.headers["retry-after-ms"] = str(max(1, round(exc.retry_after * 1000)))
    return response


MAX_ERROR_BYTES = 4096
"""No error response is larger than this, however many problems a body has."""
_MAX_LISTED = 5
"""Validation problems listed one by one; the rest are only counted."""


def _short(value: object, limit: int) -> int | str:
    if isinstance(value, int):
        return value
    text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _parts(loc: object) -> list[object]:
    """A validation error's location (a tuple or list of keys and indexes) as a list."""
    return list(loc) if isinstance(loc, (tuple, list)) else []


def validation_details(raw: Sequence[Mapping[str, object]]) -> tuple[str, JsonObject]:
    """The message and ``data`` of a validation error: the first few problems (locations,
    messages and types cut short, never the input), then how many there were in all.

    A body with a million bad keys gets a few hundred bytes back, not a copy of itself.
    """
    problems: list[JsonObject] = [
        {
            "loc": [_short(part, 64) for part in _parts(e.get("loc"))[:8]],
            "msg": _short(e.get("msg", ""), 200),
            "type": _short(e.get("type", ""), 64),
        }
        for e in raw[:_MAX_LISTED]
    ]
    if any(e.get("type") == "json_invalid" for e in raw[:_MAX_LISTED]):
        msg = "invalid JSON body"
    elif problems:
        where = ".".join(str(part) for part in _parts(problems[0]["loc"]))
        msg = str(_short(f"{where}: {problems[0]['msg']}", 300))
    else:
        msg = "invalid request"
    if len(raw) > 1:
        msg += f" (and {len(raw) - 1} more problem{'s' if len(raw) > 2 else ''})"
    errors: list[JsonValue] = [*problems]
    data: JsonObject = {"errors": errors, "count": len(raw)}
    while errors and len(json.dumps(data, ensure_ascii=False).encode()) > MAX_ERROR_BYTES - 1024:
        errors.pop()  # the list ``data`` holds
    return msg, data
