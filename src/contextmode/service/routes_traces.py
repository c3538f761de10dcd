"""``GET /v1/sessions/{id}/turns/{n}/context``: what the model received at exchange ``n``.

The data is the kept trace (`contextmode.store.records`) as `trace_to_dict` shapes it,
so ``contextmode inspect SESSION --turn N --json`` prints the same object.
Tenant-scoped like every session route: another tenant's session is not found.
A trace is written just after its reply; a read that comes first waits for it.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path
from fastapi.responses import JSONResponse

from ..store.records import trace_to_dict
from ..types import SessionKey
from .codes import SUCCESS
from .routes_sessions import SessionId, State
from .schemas import ErrorEnvelope
from .state import Tenant

__all__ = ["router"]

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorEnvelope, "description": "Invalid session id or turn number (40004, 40001)"},
    401: {"model": ErrorEnvelope, "description": "Missing or unknown API key (40101)"},
    404: {"model": ErrorEnvelope, "description": "Session (40401) or turn (40402) not found"},
    503: {"model": ErrorEnvelope, "description": "Store unavailable (50301)"},
}


@router.get(
    "/{session_id}/turns/{turn}/context",
    responses=_ERRORS,
    summary="What the model received at a past turn (turn n = the session's n-th user message)",
)
async def get_turn_context(
    session_id: SessionId,
    turn: Annotated[int, Path(ge=1, description="Exchange number: 1 = the first user message.")],
    tenant: Tenant,
    state: State,
) -> Any:
    trace = await state.engine.trace(SessionKey(tenant, session_id), turn)  # waits for a write still running
    return JSONResponse({"code": SUCCESS, "msg": "success", "data": trace_to_dict(trace)})
