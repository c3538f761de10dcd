"""Retention: how long data lives, per tenant, enforced by a background job. Off by default.

| variable | meaning |
|---|---|
| ``CONTEXTMODE_RETENTION_MAX_AGE_DAYS`` | erase sessions not updated for this many days |
| ``CONTEXTMODE_RETENTION_MAX_TURNS`` | keep at most this many newest turns per session (older ones are erased; the summary stays) |
| ``CONTEXTMODE_RETENTION_MAX_SESSIONS_PER_USER`` | keep a user's newest sessions, erase the rest |
| ``CONTEXTMODE_RETENTION_FILE`` | JSON or TOML ``{tenant: {max_age_days, max_turns, max_sessions_per_user}}``: per-tenant policies replacing the default one |
| ``CONTEXTMODE_RETENTION_INTERVAL_S`` | seconds between runs (default 3600) |

Every run erases through the same path as a forget (one transaction per
session, counted in a deletion record with scope ``retention``), so what a
policy removes is gone from the store, the caches and the audit log says so.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from ..errors import ConfigError
from ..store.base import Store
from ..store.lifecycle import LifecycleStore, merge_counts
from ..types import SessionKey, utc_now, validate_id
from .forget import LocalCaches, lifecycle_store, settle_writes

__all__ = ["RetentionPolicy", "RetentionSettings", "enforce_retention"]

_PAGE = 500


@dataclass(frozen=True, kw_only=True)
class RetentionPolicy:
    """What a tenant keeps; ``None`` = no limit."""

    max_age_days: float | None = None
    """Sessions not updated for this many days are erased."""
    max_turns: int | None = None
    """Turns per session: older ones are erased (the summary covering them stays)."""
    max_sessions_per_user: int | None = None
    """A user's newest sessions kept; older ones are erased."""

    def __post_init__(self) -> None:
        for name in ("max_age_days", "max_turns", "max_sessions_per_user"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"retention {name} must be positive, got {value}")

    @property
    def enabled(self) -> bool:
        return any(v is not None for v in (self.max_age_days, self.max_turns, self.max_sessions_per_user))

    @classmethod
    def parse(cls, raw: Mapping[str, object], where: str) -> RetentionPolicy:
        unknown = set(raw) - {"max_age_days", "max_turns", "max_sessions_per_user"}
        if unknown:
            raise ConfigError(f"{where}: unknown retention settings {sorted(unknown)}")
        try:
            age = raw.get("max_age_days")
            turns = raw.get("max_turns")
            per_user = raw.get("max_sessions_per_user")
            return cls(
                max_age_days=None if age is None else float(str(age)),
                max_turns=None if turns is None else int(str(turns)),
                max_sessions_per_user=None if per_user is None else int(str(per_user)),
            )
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None


@dataclass(frozen=True, kw_only=True)
class RetentionSettings:
    """The default policy, per-tenant ones and how often the job runs."""

    default: RetentionPolicy = field(default_factory=RetentionPolicy)
    tenants: Mapping[str, RetentionPolicy] = field(default_factory=dict)
    """Tenant → its policy (replaces the default one for that tenant)."""
    interval_s: float = 3600.0
    """Seconds between two runs of the background job."""

    def policy_for(self, tenant: str) -> RetentionPolicy:
        return self.tenants.get(tenant, self.default)

    @property
    def enabled(self) -> bool:
        return self.default.enabled or any(p.enabled for p in self.tenants.values())

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RetentionSettings:
        env = os.environ if env is None else env
        default = RetentionPolicy.parse(
            {
                "max_age_days": env.get("CONTEXTMODE_RETENTION_MAX_AGE_DAYS") or None,
                "max_turns": env.get("CONTEXTMODE_RETENTION_MAX_TURNS") or None,
                "max_sessions_per_user": env.get("CONTEXTMODE_RETENTION_MAX_SESSIONS_PER_USER") or None,
            },
            "CONTEXTMODE_RETENTION_*",
        )
        tenants: dict[str, RetentionPolicy] = {}
        if file := env.get("CONTEXTMODE_RETENTION_FILE", "").strip():
            tenants = _tenant_policies(Path(file).expanduser())
        try:
            interval = float(env.get("CONTEXTMODE_RETENTION_INTERVAL_S") or 3600.0)
        except ValueError:
            raise ConfigError("CONTEXTMODE_RETENTION_INTERVAL_S must be a number of seconds") from None
        return cls(default=default, tenants=tenants, interval_s=max(1.0, interval))


def _tenant_policies(path: Path) -> dict[str, RetentionPolicy]:
    try:
        raw = path.read_text(encoding="utf-8")
        data = tomllib.loads(raw) if path.suffix == ".toml" else json.loads(raw)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read CONTEXTMODE_RETENTION_FILE {str(path)!r}: {exc}") from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ConfigError("CONTEXTMODE_RETENTION_FILE must map tenants to {max_age_days, max_turns, max_sessions_per_user}")
    return {validate_id(t, "tenant"): RetentionPolicy.parse(p, f"retention of tenant {t!r}") for t, p in data.items()}


async def _all_sessions(store: LifecycleStore, tenant: str, user_id: str | None = None) -> list[tuple[str, int, datetime]]:
    """``(session_id, last_seq, updated_at)`` of the tenant's (or user's) sessions, newest first."""
    out: list[tuple[str, int, datetime]] = []
    offset = 0
    while True:
        page = await store.list_sessions(tenant, limit=_PAGE, offset=offset, user_id=user_id)
        out += [(i.session_id, i.last_seq, i.updated_at) for i in page]
        if len(page) < _PAGE:
            return out
        offset += _PAGE


async def _doomed(store: LifecycleStore, tenant: str, policy: RetentionPolicy, now: datetime) -> set[str]:
    doomed: set[str] = set()
    if policy.max_age_days is not None:
        cutoff = now - timedelta(days=policy.max_age_days)
        doomed |= {sid for sid, _, updated in await _all_sessions(store, tenant) if updated < cutoff}
    if policy.max_sessions_per_user is not None:
        offset = 0
        while True:
            users = await store.list_users(tenant, limit=_PAGE, offset=offset)
            for user in users:
                if user.sessions > policy.max_sessions_per_user:
                    mine = await _all_sessions(store, tenant, user.user_id)
                    doomed |= {sid for sid, _, _ in mine[policy.max_sessions_per_user:]}
            if len(users) < _PAGE:
                break
            offset += _PAGE
    return doomed


async def enforce_retention(
    store: Store,
    settings: RetentionSettings,
    *,
    now: datetime | None = None,
    caches: Sequence[LocalCaches] = (),
) -> dict[str, int]:
    """One run over every tenant; returns what was erased per kind (all tenants together)."""
    lifecycle = lifecycle_store(store)
    now = now or utc_now()
    total: dict[str, int] = {}
    for tenant in await lifecycle.list_tenants():
        policy = settings.policy_for(tenant)
        if not policy.enabled:
            continue
        record = await lifecycle.open_deletion(tenant, "retention", "*", actor="retention")
        local: dict[str, int] = {}
        doomed = await _doomed(lifecycle, tenant, policy, now)
        for session_id in sorted(doomed):
            key = SessionKey(tenant, session_id)
            await settle_writes(caches, key)
            for cache in caches:
                merge_counts(local, cache.forget_local(key))
            await lifecycle.erase_session(key, record_id=record.id)
        if policy.max_turns is not None:
            for session_id, last_seq, _ in await _all_sessions(lifecycle, tenant):
                if last_seq > policy.max_turns and session_id not in doomed:
                    key = SessionKey(tenant, session_id)
                    erased = await lifecycle.erase_turns_before(
                        key, last_seq - policy.max_turns + 1, record_id=record.id
                    )
                    if any(erased.values()):
                        for cache in caches:
                            merge_counts(local, cache.forget_local(key))
        await lifecycle.compact()
        finished = await lifecycle.finish_deletion(record.id, local)
        merge_counts(total, finished.counts)
    return total
