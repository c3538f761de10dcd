"""Envelope codes: every error the service can answer with, mapped in ONE place.

An envelope code is five digits: the HTTP status times 100 plus a number, so
``code // 100`` is always the HTTP status of the response (``0`` = 200).

| code  | HTTP | meaning                                            | raised by                      |
|-------|------|----------------------------------------------------|--------------------------------|
| 0     | 200  | success                                            |                                |
| 40001 | 400  | validation error (body, query, invalid JSON)       | `InputError`, `UserError`      |
| 40002 | 400  | message too large (characters or tokens)           | `MessageTooLarge`, `MessageTooLong` |
| 40003 | 400  | bad image (base64, MIME, size, count)              | `BadImage`                     |
| 40004 | 400  | invalid session or tenant id                       | `InvalidSessionId`             |
| 40006 | 400  | the model endpoint refused the request's parameters | `ModelRefused`                |
| 40101 | 401  | missing or unknown API key                         | `Unauthorized`                 |
| 40301 | 403  | Host or Origin names a host not allowed (DNS rebinding) | `HostNotAllowed`          |
| 40400 | 404  | no such route                                      | framework 404                  |
| 40401 | 404  | session not found                                  | `SessionNotFound`              |
| 40500 | 405  | method not allowed                                 | framework 405                  |
| 40901 | 409  | conflict: a concurrent write won                   | `ConflictError`                |
| 40902 | 409  | session busy: another turn still runs after the wait | `SessionBusy`, `LockNotAcquired` |
| 40903 | 409  | Idempotency-Key reused with another request body   | `IdempotencyKeyReused`         |
| 40904 | 409  | the first request with this Idempotency-Key still runs | `RequestInProgress`        |
| 40905 | 409  | (replayed stream's last event) its first stream was cut off there | `StreamCutOff`     |
| 41301 | 413  | request body too large                             | `PayloadTooLarge`              |
| 42201 | 422  | follow-up without a previous answer (当前没有可用的上文信息) | `NoPreviousAnswer`     |
| 42901 | 429  | the model endpoint is rate limiting (``retry-after`` passed on) | `ModelRateLimited` |
| 50000 | 500  | internal error                                     | anything else                  |
| 50001 | 500  | server misconfigured (setting, missing extra)      | `ConfigError`, `MissingExtra`  |
| 50002 | 500  | the store refused the data (a retry fails the same way) | `StoreRefused`            |
| 50201 | 502  | the model failed                                   | `ModelError`                   |
| 50202 | 502  | the model is unreachable, rate limited or failing  | `ModelUnavailable`             |
| 52901 | 529  | the model endpoint is overloaded (``retry-after`` passed on) | `ModelOverloaded`   |
| 50301 | 503  | the store is unavailable                           | `StoreError`                   |
| 50401 | 504  | the model timed out                                | `ModelTimeout`                 |

The service's own failures are subclasses of the library's error tree
(`MessageTooLong`, `BadImage`, `PayloadTooLarge` under `InputError`;
`Unauthorized` under `UserError`), so one table covers them all.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import (
    ConfigError,
    ConflictError,
    ContextModeError,
    EmptyMessage,
    InputError,
    InvalidSessionId,
    LockNotAcquired,
    MessageTooLarge,
    MissingExtra,
    ModelError,
    ModelOverloaded,
    ModelRateLimited,
    ModelRefused,
    ModelTimeout,
    ModelUnavailable,
    NoPreviousAnswer,
    SessionNotFound,
    StoreError,
    StoreRefused,
    TurnNotFound,
    UserError,
)

__all__ = [
    "CODE_TABLE",
    "INTERNAL",
    "NOT_FOUND_ROUTE",
    "SUCCESS",
    "VALIDATION",
    "BadImage",
    "ErrorCode",
    "HostNotAllowed",
    "IdempotencyKeyReused",
    "MessageTooLong",
    "PayloadTooLarge",
    "RequestInProgress",
    "StreamCutOff",
    "Unauthorized",
    "code_for_exception",
    "code_for_status",
    "http_status",
    "public_message",
]

SUCCESS = 0
VALIDATION = 40001
NOT_FOUND_ROUTE = 40400
INTERNAL = 50000


class MessageTooLong(InputError):
    """The message has more characters than the service accepts (``CONTEXTMODE_MAX_MESSAGE_CHARS``)."""


class BadImage(InputError):
    """An image is not a base64 data URL of an allowed type and size, or there are too many."""


class PayloadTooLarge(InputError):
    """The request body is larger than ``CONTEXTMODE_MAX_BODY_BYTES``."""


class Unauthorized(UserError):
    """No API key, or one that is not configured."""


class HostNotAllowed(UserError):
    """The request's ``Host`` or ``Origin`` names a host the service does not serve (DNS rebinding)."""


class IdempotencyKeyReused(ContextModeError):
    """The ``Idempotency-Key`` was first used with another request (another body or session)."""


class RequestInProgress(ContextModeError):
    """The first request with this ``Idempotency-Key`` has not finished yet; retry later."""


class StreamCutOff(ContextModeError):
    """The replayed stream of an ``Idempotency-Key`` was cut off the first time (the client left
    before its end): the replay ends with this error event where the first stream ended."""


@dataclass(frozen=True, kw_only=True)
class ErrorCode:
    """One row of the code table."""

    code: int
    """Envelope code; ``code // 100`` is the HTTP status."""
    name: str
    """Short machine name (also the ``code`` of OpenAI-shaped errors)."""
    meaning: str


# Most specific class first: the first ``isinstance`` match wins.
_BY_CLASS: tuple[tuple[type[BaseException], ErrorCode], ...] = (
    (MessageTooLarge, ErrorCode(code=40002, name="message_too_large", meaning="message too large")),
    (MessageTooLong, ErrorCode(code=40002, name="message_too_large", meaning="message too large")),
    (BadImage, ErrorCode(code=40003, name="bad_image", meaning="bad image")),
    (PayloadTooLarge, ErrorCode(code=41301, name="payload_too_large", meaning="request body too large")),
    (EmptyMessage, ErrorCode(code=40005, name="empty_message", meaning="empty or whitespace-only message")),
    (InvalidSessionId, ErrorCode(code=40004, name="invalid_session_id", meaning="invalid session or tenant id")),
    (Unauthorized, ErrorCode(code=40101, name="unauthorized", meaning="missing or unknown API key")),
    (HostNotAllowed, ErrorCode(code=40301, name="host_not_allowed", meaning="host or origin not allowed")),
    (ConfigError, ErrorCode(code=50001, name="server_misconfigured", meaning="server misconfigured")),
    (MissingExtra, ErrorCode(code=50001, name="server_misconfigured", meaning="server misconfigured")),
    (InputError, ErrorCode(code=VALIDATION, name="validation_error", meaning="validation error")),
    (UserError, ErrorCode(code=VALIDATION, name="validation_error", meaning="validation error")),
    (SessionNotFound, ErrorCode(code=40401, name="session_not_found", meaning="session not found")),
    (TurnNotFound, ErrorCode(code=40402, name="turn_not_found", meaning="no kept context for that turn")),
    (ConflictError, ErrorCode(code=40901, name="conflict", meaning="a concurrent write won")),
    (LockNotAcquired, ErrorCode(code=40902, name="session_busy", meaning="session busy")),
    (IdempotencyKeyReused, ErrorCode(code=40903, name="idempotency_key_reused", meaning="Idempotency-Key reused")),
    (RequestInProgress, ErrorCode(code=40904, name="request_in_progress", meaning="request in progress")),
    (StreamCutOff, ErrorCode(code=40905, name="stream_cut_off", meaning="the first stream was cut off")),
    (NoPreviousAnswer, ErrorCode(code=42201, name="no_previous_answer", meaning="当前没有可用的上文信息")),
    (ModelOverloaded, ErrorCode(code=52901, name="model_overloaded", meaning="the model endpoint is overloaded")),
    (ModelRateLimited, ErrorCode(code=42901, name="rate_limited", meaning="the model endpoint is rate limiting")),
    (ModelRefused, ErrorCode(code=40006, name="model_refused_request",
                             meaning="the model endpoint refused the request's parameters")),
    (ModelTimeout, ErrorCode(code=50401, name="model_timeout", meaning="the model timed out")),
    (ModelUnavailable, ErrorCode(code=50202, name="model_unavailable", meaning="the model is unavailable")),
    (ModelError, ErrorCode(code=50201, name="model_error", meaning="the model failed")),
    (StoreRefused, ErrorCode(code=50002, name="store_refused", meaning="the store refused the data")),
    (StoreError, ErrorCode(code=50301, name="store_unavailable", meaning="the store is unavailable")),
    (ContextModeError, ErrorCode(code=INTERNAL, name="internal_error", meaning="internal error")),
)

_INTERNAL = ErrorCode(code=INTERNAL, name="internal_error", meaning="internal error")

_BY_STATUS: dict[int, ErrorCode] = {
    400: ErrorCode(code=VALIDATION, name="validation_error", meaning="validation error"),
    401: ErrorCode(code=40101, name="unauthorized", meaning="missing or unknown API key"),
    404: ErrorCode(code=NOT_FOUND_ROUTE, name="not_found", meaning="no such route"),
    405: ErrorCode(code=40500, name="method_not_allowed", meaning="method not allowed"),
    413: ErrorCode(code=41301, name="payload_too_large", meaning="request body too large"),
    422: ErrorCode(code=VALIDATION, name="validation_error", meaning="validation error"),
}

CODE_TABLE: tuple[ErrorCode, ...] = tuple(
    sorted(
        ({row.code: row for _, row in _BY_CLASS} | {row.code: row for row in _BY_STATUS.values()}).values(),
        key=lambda row: row.code,
    )
)
"""Every code the service can answer with, ascending (success excluded)."""


def code_for_exception(exc: BaseException) -> ErrorCode:
    """The table row for ``exc`` (``50000`` for anything outside the error tree)."""
    for cls, row in _BY_CLASS:
        if isinstance(exc, cls):
            return row
    return _INTERNAL


def code_for_status(status: int) -> ErrorCode:
    """The table row for a framework HTTP error with ``status``."""
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    if status >= 500:
        return _INTERNAL
    return ErrorCode(code=status * 100, name="http_error", meaning="HTTP error")


def http_status(code: int) -> int:
    """The HTTP status of an envelope code (``0`` → 200)."""
    return 200 if code == SUCCESS else code // 100


STORE_UNAVAILABLE_MSG = "the store is unavailable; try again"
STORE_REFUSED_MSG = "the store refused this request's data; nothing was stored and sending it again will fail the same way"


def public_message(exc: BaseException, row: ErrorCode) -> str:
    """What the client is told about ``exc``: its message, except for internal errors and
    store failures, whose driver text (host, port, SQL) stays in the server log."""
    if row.code == INTERNAL:
        return "internal error"
    if isinstance(exc, StoreRefused):
        return STORE_REFUSED_MSG
    if isinstance(exc, StoreError):
        return STORE_UNAVAILABLE_MSG
    return str(exc)
