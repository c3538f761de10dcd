"""``/v1/sessions``: chat turns (envelope or SSE), history, context preview, listing, deletion."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from ..engine import TurnRequest, TurnResult
from ..errors import ModelError, SessionNotFound
from ..lifecycle.forget import forget
from ..store.lifecycle import is_lifecycle_store
from ..store.usage import session_storage
from ..types import SessionKey, validate_id
from .bodies import OffLoopJsonRoute
from .codes import SUCCESS, code_for_exception, public_message
from .idempotency import IdempotencyKey, claim
from .images import ImageFiles, decode_images
from .schemas import (
    ConstraintOut,
    ContextOut,
    DeletedOut,
    Envelope,
    ErrorEnvelope,
    JobStatsOut,
    MessageRequest,
    SessionListOut,
    SessionOut,
    SessionStatsOut,
    SessionSummaryOut,
    StorageOut,
    SummaryOut,
    TurnOut,
    TurnRecord,
)
from .sse import DONE, sse_event
from .state import AppState, Tenant, app_state
from .turns import (
    Interrupted,
    StartedStream,
    check_message,
    coalesce,
    interrupted_response,
    run_turn,
    serve_turn,
    start_stream,
)

__all__ = ["envelope", "router"]

log = logging.getLogger("contextmode.service")

router = APIRouter(prefix="/v1/sessions", tags=["sessions"], route_class=OffLoopJsonRoute)

State = Annotated[AppState, Depends(app_state)]
SessionId = Annotated[str, Path(description="Session id: 1-128 characters of A-Z a-z 0-9 . _ : -")]

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorEnvelope, "description": "Validation error, bad image, message too large (40001-40004)"},
    401: {"model": ErrorEnvelope, "description": "Missing or unknown API key (40101)"},
    404: {"model": ErrorEnvelope, "description": "Session not found (40401)"},
    409: {"model": ErrorEnvelope, "description": "Session busy (40902), Idempotency-Key reused (40903) or still running (40904)"},
    500: {"model": ErrorEnvelope, "description": "Internal error (50000)"},
    503: {"model": ErrorEnvelope, "description": "Store unavailable (50301)"},
}
_TURN_ERRORS: dict[int | str, dict[str, Any]] = {
    **_ERRORS,
    413: {"model": ErrorEnvelope, "description": "Request body too large (41301)"},
    422: {"model": ErrorEnvelope, "description": "Follow-up with no previous answer (42201)"},
    502: {"model": ErrorEnvelope, "description": "Model error (50201, 50202)"},
    504: {"model": ErrorEnvelope, "description": "Model timeout (50401)"},
    200: {
        "description": "An envelope, or with stream=true an SSE stream (see docs/service.md)",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    },
}


def envelope(data: BaseModel, msg: str = "success") -> JSONResponse:
    """A success envelope (``code`` 0) around ``data``, serialised once (no second validation)."""
    return JSONResponse({"code": SUCCESS, "msg": msg, "data": data.model_dump(mode="json")})


def _key(tenant: str, session_id: str) -> SessionKey:
    """The session's key, its ids checked (the only check of this request's ids)."""
    return SessionKey(tenant, session_id)


def _done_event(result: TurnResult) -> bytes:
    return sse_event(
        {
            "type": "done",
            "answer": result.answer,
            "partial": result.partial,
            "seq": result.assistant_turn.seq if result.assistant_turn else None,
            "user_seq": result.user_turn.seq,
            "turn": result.user_turn.metadata.get("turn"),
            "jobs": list(result.jobs),
            "ttft_ms": result.ttft_ms,
            "model_ms": result.model_ms,
        }
    )


def _error_event(exc: Exception, partial: str) -> bytes:
    # partial: the text streamed so far is stored as a partial answer, and sent again here
    row = code_for_exception(exc)
    msg = public_message(exc, row)
    return sse_event({"type": "error", "code": row.code, "msg": msg, "partial": bool(partial), "partial_answer": partial})


async def _turn_events(started: StartedStream, session_id: str, state: AppState) -> AsyncIterator[bytes]:
    """The turn's events as SSE: ``context``, ``delta``…, then ``done`` or ``error``, then ``[DONE]``."""
    context = ContextOut.of(started.prepared, full=False).model_dump(mode="json")
    yield sse_event({"type": "context", "session_id": session_id, **context})
    pieces: list[str] = []
    settings = state.settings
    events = coalesce(started.events, flush_ms=settings.stream_flush_ms, flush_bytes=settings.stream_flush_bytes)
    try:
        async for event in events:
            match event.kind:
                case "delta":
                    pieces.append(event.text)
                    yield sse_event({"type": "delta", "text": event.text})
                case "done":
                    yield _done_event(event.result)
                case "failed":
                    yield _error_event(event.error, event.partial_answer)
    except Exception as exc:
        # Headers are gone: a failure mid-stream becomes an error event, then [DONE].
        if not isinstance(exc, ModelError):
            log.exception("turn failed mid-stream (session %s)", session_id)
        yield _error_event(exc, "".join(pieces))
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    yield DONE


@router.post(
    "/{session_id}/messages",
    response_model=Envelope[TurnOut],
    responses=_TURN_ERRORS,
    summary="Send a message: the answer as one envelope, or streamed as SSE",
)
async def post_message(
    session_id: SessionId,
    body: MessageRequest,
    tenant: Tenant,
    state: State,
    idempotency_key: IdempotencyKey = None,
) -> Any:
    key = _key(tenant, session_id)
    check_message(body.message, state.settings)
    request = TurnRequest(
        key=key, message=body.message, mode=body.mode or state.engine.settings.mode, user_id=body.user_id,
        idempotency_key=idempotency_key,
    )
    # Images are checked before the key is claimed: a refused image must not hold the key for its lease.
    decoded = decode_images(body.images, state.settings)
    held, replay = await claim(
        state.engine.store, tenant, idempotency_key, ["sessions", session_id, body.model_dump_json()],
        session_id=session_id, mask=state.engine.settings.pii_for(tenant) == "mask",
    )
    if replay is not None:
        return replay
    path = f"/v1/sessions/{session_id}/messages"

    def with_images() -> tuple[TurnRequest, ImageFiles]:
        images = ImageFiles.write(decoded, state.settings.image_dir)
        return replace(request, images=images.refs()), images

    async def whole() -> Response:
        turn, images = with_images()
        try:
            result = await run_turn(state.engine, turn, images=images, metrics=state.metrics)
        except Interrupted as stop:
            # The user turn and the partial answer are stored: the client gets the error and the text.
            return interrupted_response(path, stop)
        return envelope(TurnOut.of(session_id, result))

    async def streamed() -> tuple[StartedStream, AsyncIterator[bytes]]:
        turn, images = with_images()
        started = await start_stream(state.engine, turn, images=images, metrics=state.metrics)
        return started, _turn_events(started, session_id, state)

    return await serve_turn(
        state, tenant, session_id, held, whole=None if body.stream else whole, streamed=streamed
    )


@router.get(
    "/{session_id}/context",
    response_model=Envelope[ContextOut],
    responses={**_ERRORS, 422: _TURN_ERRORS[422]},
    summary="The exact context the next message would get (writes nothing)",
)
async def get_context(
    session_id: SessionId,
    tenant: Tenant,
    state: State,
    message: Annotated[str, Query(min_length=1, description="The message to prepare the context for.")],
    mode: Annotated[Literal["contextual", "decoupled"] | None, Query()] = None,
) -> Any:
    key = _key(tenant, session_id)
    check_message(message, state.settings)
    prepared = await state.engine.prepare(TurnRequest(key=key, message=message, mode=mode))
    return envelope(ContextOut.of(prepared, full=True))


@router.get(
    "/{session_id}",
    response_model=Envelope[SessionOut],
    responses=_ERRORS,
    summary="History (paginated, oldest first), summary, constraints and job stats",
)
async def get_session(
    session_id: SessionId,
    tenant: Tenant,
    state: State,
    limit: Annotated[int, Query(ge=1, le=500, description="Turns per page.")] = 50,
    before: Annotated[int | None, Query(ge=1, description="Only turns with seq < before (default: the newest).")] = None,
) -> Any:
    key = _key(tenant, session_id)
    store = state.engine.store
    # Read before the store: a job that ends meanwhile is then either still pending here or
    # counted in `info`, never neither.
    pending = state.engine.jobs.pending(tenant, session_id)
    info = await store.info(key)
    if info is None:
        raise SessionNotFound(f"no session {session_id!r}")
    end = min(before - 1 if before is not None else info.last_seq, info.last_seq)
    start = max(1, end - limit + 1)
    turns = await store.turns(key, from_seq=start, to_seq=end) if end >= 1 else []
    loaded = await store.load(key, recent=0, max_uncovered=0)
    data = SessionOut(
        session_id=session_id,
        last_seq=info.last_seq,
        created_at=info.created_at,
        updated_at=info.updated_at,
        turns=[TurnRecord.of(t) for t in turns],
        next_before=start if start > 1 and end >= 1 else None,
        summary=SummaryOut.of(loaded.summary) if loaded.summary else None,
        constraints=[ConstraintOut.of(c) for c in loaded.constraints],
        last_answer=loaded.last_answer,
        stats=SessionStatsOut(
            summary_covers_seq=info.summary_covers_seq,
            summary_version=info.summary_version,
            constraints_version=info.constraints_version,
            jobs={
                name: JobStatsOut(ok=s.ok, failed=s.failed, rejected=s.rejected, last_error=s.last_error,
                                  last_run=s.last_run)
                for name, s in info.jobs.items()
            },
            pending_jobs=pending,
        ),
    )
    return envelope(data)


@router.get(
    "/{session_id}/storage",
    response_model=Envelope[StorageOut],
    responses={**_ERRORS, 400: {"model": ErrorEnvelope, "description": "Invalid session id; or a store that does not report its size (40001)"}},
    summary="The bytes the session keeps, by kind of record",
)
async def get_storage(session_id: SessionId, tenant: Tenant, state: State) -> Any:
    key = _key(tenant, session_id)
    await state.engine.settle_writes(key)  # a trace still being written counts
    usage = await session_storage(state.engine.store, key)
    return envelope(StorageOut(session_id=session_id, exchanges=usage.exchanges, raw_text_bytes=usage.raw_text_bytes,
                               total_bytes=usage.total_bytes, per_exchange=usage.per_exchange, bytes=dict(usage.bytes)))


@router.delete(
    "/{session_id}", response_model=Envelope[DeletedOut], responses=_ERRORS, summary="Delete a session and all its records"
)
async def delete_session(session_id: SessionId, tenant: Tenant, state: State) -> Any:
    key = _key(tenant, session_id)
    store = state.engine.store
    if await store.info(key) is None:
        raise SessionNotFound(f"no session {session_id!r}")
    if not is_lifecycle_store(store):  # a custom store without the lifecycle abilities
        await state.engine.settle_writes(key)  # a trace still being written
        state.engine.forget_local(key)
        if not await store.delete(key):
            raise SessionNotFound(f"no session {session_id!r}")
        return envelope(DeletedOut(session_id=session_id, deleted=True))
    record = await forget(
        state.engine.store, tenant, "session", session_id, actor=f"api:{tenant}",
        caches=[state.engine], image_dir=state.settings.image_dir,
    )
    state.metrics.count_erased("forget", record.counts)
    return envelope(DeletedOut(session_id=session_id, deleted=True, counts=dict(record.counts),
                               deletion_id=record.id))


@router.get("", response_model=Envelope[SessionListOut], responses=_ERRORS, summary="The tenant's sessions, newest first")
async def list_sessions(
    tenant: Tenant,
    state: State,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0)] = 0,
    user_id: Annotated[str | None, Query(description="Only this user's sessions.")] = None,
) -> Any:
    if user_id is not None:
        validate_id(user_id, "user id")
    infos = await state.engine.store.list_sessions(tenant, limit=limit, offset=offset, user_id=user_id)
    data = SessionListOut(sessions=[SessionSummaryOut.of(i) for i in infos], limit=limit, offset=offset)
    return envelope(data)

