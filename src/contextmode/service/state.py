"""What every route needs: the engine, the settings, the keys and the metrics (one per app)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from ..engine import Engine
from .auth import ApiKeys
from .gate import SessionGate
from .metrics import ServiceMetrics
from .settings import ServiceSettings

__all__ = ["AppState", "Tenant", "app_state", "tenant"]


@dataclass(frozen=True, kw_only=True)
class AppState:
    engine: Engine
    settings: ServiceSettings
    keys: ApiKeys
    metrics: ServiceMetrics
    owns_engine: bool
    """True when `create_app` built the engine (then the app closes it at shutdown)."""
    gate: SessionGate
    """One turn at a time per session (docs/service.md)."""


async def app_state(request: Request) -> AppState:
    """The app's `AppState` (set by `create_app`). Async: a sync dependency would cost a thread hop."""
    state: AppState = request.app.state.contextmode
    return state


_bearer = HTTPBearer(auto_error=False, description="Authorization: Bearer <API key>")
_api_key = APIKeyHeader(name="X-API-Key", auto_error=False, description="X-API-Key: <API key>")


async def tenant(
    request: Request,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)] = None,
    x_api_key: Annotated[str | None, Security(_api_key)] = None,
) -> str:
    """The caller's tenant from its API key (``local`` when no key is configured)."""
    authorization = f"Bearer {bearer.credentials}" if bearer is not None else None
    state: AppState = request.app.state.contextmode
    found = state.keys.tenant_for(authorization, x_api_key)
    request.state.tenant = found
    return found


Tenant = Annotated[str, Depends(tenant)]
