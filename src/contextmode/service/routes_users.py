"""``/v1/users`` and ``/v1/deletions``: a tenant's users, forgetting one, and the audit log.

``DELETE /v1/users/{user_id}`` erases every session of the user in the
caller's tenant with all derived records (docs/lifecycle.md) and answers with
the counts per kind and the id of the deletion record. It is idempotent: a
user already forgotten gives zero counts.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query

from ..lifecycle.forget import forget, lifecycle_store
from ..types import validate_id
from .routes_sessions import envelope
from .schemas import DeletionListOut, DeletionOut, Envelope, ErrorEnvelope, UserListOut, UserOut
from .state import AppState, Tenant, app_state

__all__ = ["router"]

router = APIRouter(tags=["users"])

State = Annotated[AppState, Depends(app_state)]
UserId = Annotated[str, Path(description="User id: 1-128 characters of A-Z a-z 0-9 . _ : -")]

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorEnvelope, "description": "Invalid user id (40001)"},
    401: {"model": ErrorEnvelope, "description": "Missing or unknown API key (40101)"},
    503: {"model": ErrorEnvelope, "description": "Store unavailable (50301)"},
}


@router.get("/v1/users", response_model=Envelope[UserListOut], responses=_ERRORS,
            summary="The tenant's users (sessions that named one), most recently active first")
async def list_users(
    tenant: Tenant,
    state: State,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> Any:
    users = await lifecycle_store(state.engine.store).list_users(tenant, limit=limit, offset=offset)
    return envelope(UserListOut(
        users=[UserOut(user_id=u.user_id, sessions=u.sessions, updated_at=u.updated_at) for u in users],
        limit=limit, offset=offset,
    ))


@router.delete("/v1/users/{user_id}", response_model=Envelope[DeletionOut], responses=_ERRORS,
               summary="Forget a user: erase all their sessions and everything derived from them")
async def forget_user(user_id: UserId, tenant: Tenant, state: State) -> Any:
    validate_id(user_id, "user id")
    record = await forget(
        state.engine.store, tenant, "user", user_id, actor=f"api:{tenant}",
        caches=[state.engine], image_dir=state.settings.image_dir,
    )
    state.metrics.count_erased("forget", record.counts)
    return envelope(DeletionOut.of(record))


@router.get("/v1/deletions", response_model=Envelope[DeletionListOut], responses=_ERRORS,
            summary="The tenant's deletion records (audit: who, when, counts; no content)")
async def list_deletions(
    tenant: Tenant,
    state: State,
    since_id: Annotated[int, Query(ge=0, description="Only records after this id.")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> Any:
    store = lifecycle_store(state.engine.store)
    found: list[DeletionOut] = []
    while len(found) < limit:
        page = await store.deletions(since_id=since_id, limit=500)
        found += [DeletionOut.of(r) for r in page if r.tenant == tenant]
        if len(page) < 500:
            break
        since_id = page[-1].id
    return envelope(DeletionListOut(deletions=found[:limit]))
