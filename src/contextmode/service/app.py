"""The FastAPI app: `create_app(engine=None, settings=None)`.

Every non-stream response is an envelope ``{code, msg, data}``,
errors included: the library's errors, validation errors, invalid JSON,
unknown routes and uncaught exceptions all go through `codes` (one table).
Under ``/v1/chat/completions`` and ``/v1/models`` errors take OpenAI's shape
instead, since that is what the openai SDK parses.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..engine import Engine
from ..engine.warmup import warm_up
from ..errors import ContextModeError, StoreError
from ..jobs import takes_hooks
from ..store.base import keeps_idempotency
from ..types import SessionKey
from .auth import ApiKeys
from .bodyscan import JsonShape
from .client_gone import reset, watching
from .codes import (
    ErrorCode,
    HostNotAllowed,
    Unauthorized,
    code_for_exception,
    code_for_status,
)
from .gate import SessionGate
from .hosts import HostCheck, default_hosts
from .lifecycle_tasks import lifecycle_tasks
from .metrics import ServiceMetrics
from .responses import error_response, exception_response, validation_details
from .routes_anthropic import router as anthropic_router
from .routes_openai import router as openai_router
from .routes_responses import router as responses_router
from .routes_sessions import envelope
from .routes_sessions import router as sessions_router
from .routes_traces import router as traces_router
from .routes_users import router as users_router
from .schemas import Envelope, ErrorEnvelope, HealthOut
from .settings import ServiceSettings
from .state import AppState

__all__ = ["create_app"]

log = logging.getLogger("contextmode.http")

_error_response = error_response
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


async def _send_error(scope: Scope, send: Send, row: ErrorCode, msg: str) -> None:
    """Answer from the edge, before the body is read: then close the connection, so the
    server does not spend its time receiving (and dropping) the rest of a large body."""
    response = _error_response(scope.get("path", ""), row, msg)
    response.headers["connection"] = "close"
    await response(scope, _no_receive, send)


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}


class _EdgeMiddleware:
    """Pure ASGI (no buffering of streams): body-size limit, request log and metrics,
    a ``Server-Timing: app;dur=<ms>`` header (time until the headers), last-resort 50000.

    The log line holds method, path, status, duration and tenant: never headers,
    query strings or bodies, so no key or message text reaches the logs.
    """

    def __init__(self, app: ASGIApp, *, state: AppState) -> None:
        self.app = app
        self.state = state
        settings = state.settings
        self.hosts = HostCheck(
            settings.allowed_hosts or default_hosts(settings.host, auth_enabled=settings.auth_enabled)
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        if scope.get("path") != "/healthz":  # probes name the pod's address; health reads no session
            try:
                self.hosts.check(scope.get("headers", ()))
            except HostNotAllowed as exc:
                await _send_error(scope, send, code_for_exception(exc), str(exc))
                self._record(scope, 403, started)
                return
        limit = self.state.settings.max_body_bytes
        too_large = code_for_status(413)
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                await _send_error(scope, send, too_large, f"the request body is larger than {limit} bytes")
                self._record(scope, 413, started)
                return
        if scope.get("method") in _BODY_METHODS and not await self._authorised(scope, send):
            self._record(scope, 401, started)
            return
        status = 500
        response_started = False
        received = 0
        shape = JsonShape()
        max_items = self.state.settings.max_json_items
        max_depth = self.state.settings.max_json_depth
        checks_body = scope.get("method") in _BODY_METHODS

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            # Only methods that carry a body have it checked: a GET's route never reads one, and the
            # page's file response reads only to wait for the disconnect, while it sends.
            if message["type"] == "http.request" and checks_body:
                chunk = message.get("body", b"")
                received += len(chunk)
                if received > limit:
                    raise StarletteHTTPException(413, f"the request body is larger than {limit} bytes")
                if shape.feed(chunk) > max_items:
                    raise StarletteHTTPException(
                        400, f"the JSON body has more than {max_items} keys and array items"
                    )
                if shape.deepest > max_depth:
                    raise StarletteHTTPException(400, f"the JSON body is nested deeper than {max_depth} levels")
            return message

        async def observed_send(message: Message) -> None:
            nonlocal status, response_started
            if message["type"] == "http.response.start":
                status, response_started = message["status"], True
                # Time spent before the headers (the whole handling of a non-stream request).
                elapsed = (time.perf_counter() - started) * 1000
                headers = [*message.get("headers", ()), (b"server-timing", f"app;dur={elapsed:.3f}".encode())]
                message = {**message, "headers": headers}
            await send(message)

        watched = watching(limited_receive)  # a whole answer's turn ends if its client leaves
        try:
            await self.app(scope, limited_receive, observed_send)
        except Exception:
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            if not response_started:
                status = 500
                await _send_error(scope, send, code_for_exception(RuntimeError()), "internal error")
        finally:
            reset(watched)
            self._record(scope, status, started)

    async def _authorised(self, scope: Scope, send: Send) -> bool:
        """Check the API key from the headers before a byte of the body is read.

        Only for the service's own routes under ``/v1/``; the route's dependency
        checks again and sets the tenant. A refused request costs no body read.
        """
        keys = self.state.keys
        if not keys.enabled or not scope.get("path", "").startswith("/v1/"):
            return True
        try:
            keys.tenant_for_headers(scope.get("headers", ()))
        except Unauthorized as exc:
            await _send_error(scope, send, code_for_exception(exc), str(exc))
            return False
        return True

    def _record(self, scope: Scope, status: int, started: float) -> None:
        elapsed = time.perf_counter() - started
        route = scope.get("route")
        template = getattr(route, "path", None) or "unmatched"
        method = scope.get("method", "")
        metrics = self.state.metrics
        metrics.http_requests.labels(method=method, route=template, status=str(status)).inc()
        metrics.http_seconds.labels(method=method, route=template).observe(elapsed)
        tenant = (scope.get("state") or {}).get("tenant", "-")
        log.info(
            "%s %s %d %.1fms tenant=%s",
            method,
            scope.get("path", ""),
            status,
            elapsed * 1000,
            tenant,
            extra={"method": method, "route": template, "status": status, "duration_ms": elapsed * 1000, "tenant": tenant},
        )


_HEALTH_KEY = "contextmode-healthz-write-probe"


class _WriteProbe:
    """Writes and deletes one record (an ``Idempotency-Key`` claim of no session), so a store that
    answers reads but refuses writes (a full disk, a read-only replica) is reported. A success is
    trusted for ``every_s`` seconds (probes come every few seconds; two writes each would cost
    every other request); a failure is probed again at the next call."""

    def __init__(self, every_s: float = 5.0) -> None:
        self.every_s = every_s
        self._ok_at = -float("inf")

    async def check(self, state: AppState) -> None:
        store = state.engine.store
        if time.monotonic() - self._ok_at < self.every_s or not keeps_idempotency(store):
            return
        tenant = state.settings.local_tenant
        if await store.claim_idempotency(tenant, _HEALTH_KEY, "healthz", session_id="healthz", lease_s=30) is not None:
            await store.release_idempotency(tenant, _HEALTH_KEY)  # left by a probe cut off: claim again
            await store.claim_idempotency(tenant, _HEALTH_KEY, "healthz", session_id="healthz", lease_s=30)
        await store.release_idempotency(tenant, _HEALTH_KEY)
        self._ok_at = time.monotonic()


def _install_handlers(app: FastAPI) -> None:
    @app.exception_handler(ContextModeError)
    async def library_error(request: Request, exc: ContextModeError) -> JSONResponse:
        row = code_for_exception(exc)
        if row.code >= 50000:
            log.warning("%s on %s: %s", type(exc).__name__, request.url.path, exc)
        return exception_response(request.url.path, exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        msg, data = validation_details(exc.errors())
        return _error_response(request.url.path, code_for_status(400), msg, data=data)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        row = code_for_status(exc.status_code)
        # FastAPI turns a failure while reading the body into a bare 400; say what it was.
        cause = exc.__cause__
        if isinstance(cause, StarletteHTTPException):  # refused by the edge while reading (413, key cap)
            response = _error_response(request.url.path, code_for_status(cause.status_code), str(cause.detail))
            response.headers["connection"] = "close"  # the rest of the body is not worth receiving
            return response
        if exc.status_code == 400 and cause is not None:
            detail = "invalid JSON body (not UTF-8, nested too deeply, or malformed)"
        else:
            detail = str(exc.detail) if exc.detail else row.meaning
        return _error_response(request.url.path, row, detail)


def create_app(engine: Engine | None = None, settings: ServiceSettings | None = None) -> FastAPI:
    """The HTTP service around ``engine`` (default: `build_engine()` from the environment, offline).

    The metrics are the engine's job runner's hooks (they count jobs). An engine
    built here is closed at shutdown; one passed in stays the caller's.
    """
    settings = settings or ServiceSettings.from_env()
    owns_engine = engine is None
    if engine is None:
        from ..api import build_engine

        engine = build_engine()
    metrics = ServiceMetrics()
    if takes_hooks(engine.jobs):
        engine.jobs.hooks = metrics  # counts scheduled jobs and failed attempts
    else:
        log.info("the engine's job queue takes no hooks: background jobs are not counted in the metrics")
    state = AppState(
        engine=engine,
        settings=settings,
        keys=ApiKeys(settings.api_keys, local_tenant=settings.local_tenant),
        metrics=metrics,
        owns_engine=owns_engine,
        gate=SessionGate(engine.store, wait_ms=settings.session_wait_ms, ttl_s=settings.session_lock_ttl_s),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The first context after a restart costs what the next ones do: jieba's dictionary
        # and the offline processors' models load now, before the first request.
        try:
            log.info("warmed up in %.0f ms", await warm_up(state.engine))
        except Exception:  # a processor of the user's that fails on the sample: serve anyway
            log.warning("warm-up failed; the first turn loads what it needs", exc_info=True)
        # What is alive at startup (modules, and lexicons or models already loaded) stays alive:
        # the collector no longer scans it at every full collection (CPU on every turn). Once
        # per process: later apps (tests) would otherwise pin the garbage of earlier ones.
        if not gc.get_freeze_count():
            gc.freeze()
        async with lifecycle_tasks(state):
            yield
        if state.owns_engine:
            await state.engine.close()  # waits for the trace writes and the jobs first
        else:
            await state.engine.trace_writes.drain()  # the last replies' traces are not lost

    from .._version import __version__

    app = FastAPI(
        title="context-mode",
        version=__version__,
        description="Memory for LLM chat apps: SSE chat with per-layer token accounting, an "
        "OpenAI-compatible memory proxy, session history. Non-stream responses are "
        "`{code, msg, data}` envelopes; see docs/service.md for the code table.",
        lifespan=lifespan,
    )
    app.state.contextmode = state
    _install_handlers(app)
    app.add_middleware(_EdgeMiddleware, state=state)
    app.include_router(sessions_router)
    app.include_router(traces_router)
    app.include_router(openai_router)
    app.include_router(anthropic_router)
    app.include_router(responses_router)
    app.include_router(users_router)

    write_probe = _WriteProbe()

    @app.get("/healthz", response_model=Envelope[HealthOut], responses={503: {"model": ErrorEnvelope}}, tags=["ops"])
    async def healthz(request: Request) -> Any:
        current: AppState = request.app.state.contextmode
        try:
            await asyncio.wait_for(current.engine.store.version(SessionKey(current.settings.local_tenant, "healthz")), 5.0)
        except Exception as exc:
            log.warning("health check: store unavailable: %s", type(exc).__name__)
            return _error_response("/healthz", code_for_exception(StoreError("down")), "store unavailable")
        try:
            await asyncio.wait_for(write_probe.check(current), 5.0)
        except Exception as exc:  # reads work, writes fail: a full disk, a read-only replica
            log.warning("health check: store cannot write: %s", type(exc).__name__)
            return _error_response("/healthz", code_for_exception(StoreError("read-only")), "store cannot write")
        return envelope(
            HealthOut(status="ok", store=type(current.engine.store).__name__, model=current.engine.model.name)
        )

    @app.get("/metrics", tags=["ops"], response_class=Response, summary="Prometheus metrics")
    async def prometheus(request: Request) -> Response:
        state: AppState = request.app.state.contextmode
        body, content_type = state.metrics.exposition()
        return Response(body, media_type=content_type)

    from .web import mount_web  # the inspector page at / and its assets under /static (docs/web.md)

    mount_web(app)
    return app

