"""The `Store` seam: an append-only turn log plus versioned derived records.

A store is four small protocols in one object:

- `TurnLog`: compare-and-set appends and bounded reads of the log;
- `DerivedRecords`: summary, pinned constraints and emotion scores, each a
  record that says which turns it covers and is committed by compare-and-set;
- `SessionAdmin`: listing, info, deletion and retention;
- `JobLocks`: a per-session lock, single-flight across processes, that expires
  when its holder dies, with a fencing token.

Every call is scoped by ``tenant``; ids are validated with `validate_id`
before they reach a backend. Turns are never rewritten or deleted except by
erasing the whole session or by a retention policy's turn limit (the lifecycle
abilities in `store.lifecycle`, docs/lifecycle.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, Self, runtime_checkable

from ..types import Constraint, NewTurn, SessionState, Summary, Turn

__all__ = [
    "ClosesOnExit",
    "DerivedRecords",
    "JobLocks",
    "JobStats",
    "LockHandle",
    "SessionAdmin",
    "SessionInfo",
    "SessionVersion",
    "Store",
    "TurnLog",
]


@dataclass(frozen=True, kw_only=True)
class JobStats:
    """Outcome counters of one kind of background job for one session."""

    ok: int = 0
    failed: int = 0
    last_error: str | None = None
    """Message of the last failure (no secrets), ``None`` after a success."""
    last_run: datetime | None = None


@dataclass(frozen=True, kw_only=True)
class SessionInfo:
    """What a listing or the inspector shows of a session without loading it."""

    tenant: str
    session_id: str
    last_seq: int
    created_at: datetime
    updated_at: datetime
    summary_covers_seq: int = 0
    summary_version: int = 0
    constraints_version: int = 0
    jobs: Mapping[str, JobStats] = field(default_factory=dict)
    """Job name (``summary``, ``constraints``, ``emotion``) → outcome counters."""
    user_id: str | None = None
    """The user the session belongs to, if one was named."""


@dataclass(frozen=True, kw_only=True)
class SessionVersion:
    """A cheap probe of everything `load()` returns; equal probes mean equal states.

    Every counter only grows while the session exists, and ``created_at`` changes
    when it is deleted and re-created, so a cache holding a state loaded at one
    probe knows it is stale as soon as any field differs.
    """

    last_seq: int = 0
    """Sequence number of the newest turn (0 = no such session)."""
    summary_version: int = 0
    """Version of the committed summary (0 = none)."""
    constraints_version: int = 0
    """Version of the pinned constraints."""
    emotions_version: int = 0
    """Bumped at every `set_emotions` call that changed a score."""
    created_at: datetime | None = None
    """When the session was created (``None`` = no such session): tells a session
    deleted and re-created with the same counters from the one a cache holds."""


@dataclass(frozen=True, kw_only=True)
class LockHandle:
    """A held job lock. ``token`` increases at every acquisition (fencing)."""

    key: str
    token: int


@runtime_checkable
class TurnLog(Protocol):
    async def append(
        self,
        tenant: str,
        session_id: str,
        turns: Sequence[NewTurn],
        *,
        expected_last_seq: int | None = None,
        user_id: str | None = None,
    ) -> list[Turn]:
        """Append ``turns`` atomically after the session's last turn and return them numbered.

        With ``expected_last_seq`` the append is a compare-and-set and raises
        `ConflictError` if the session's last sequence number differs. Creates
        the session if needed. Appending an assistant turn also sets the
        session's last answer. An empty ``turns`` writes nothing and returns
        ``[]`` (the compare-and-set is still checked).

        ``user_id`` names the session's user: the first one given sticks, and a
        different one later raises `InputError` (a session never changes hands).
        """
        ...

    async def load(
        self,
        tenant: str,
        session_id: str,
        *,
        recent: int = 8,
        max_uncovered: int = 200,
        key_moments: int = 0,
        key_moment_threshold: float = 0.7,
    ) -> SessionState:
        """The state a turn needs, read in O(window), not O(history).

        Turns: those after the summary's coverage, at least the last ``recent``,
        at most ``max_uncovered``. ``key_moments`` > 0 also loads up to that many
        older turns with emotion ≥ ``key_moment_threshold`` (strongest first),
        through an index. An unknown session gives an empty state (``last_seq`` 0).
        """
        ...

    async def turns(
        self, tenant: str, session_id: str, *, from_seq: int = 1, to_seq: int | None = None
    ) -> list[Turn]:
        """Turns with ``from_seq <= seq <= to_seq``, oldest first."""
        ...

    async def version(self, tenant: str, session_id: str) -> SessionVersion:
        """A one-row probe of the session's counters (all 0 for an unknown session).

        Caches compare it with the probe taken at load time to never serve a
        state another process has changed since.
        """
        ...


@runtime_checkable
class DerivedRecords(Protocol):
    async def commit_summary(
        self, tenant: str, session_id: str, summary: Summary, *, expected_version: int
    ) -> bool:
        """Commit ``summary`` as version ``expected_version + 1`` (its own ``version`` is ignored).

        Returns False (and changes nothing) when the stored version is not
        ``expected_version``, the summary covers no more turns than the stored one,
        covers turns that do not exist, or the session does not exist: a result
        computed from an older state never overwrites a newer one.
        """
        ...

    async def commit_constraints(
        self,
        tenant: str,
        session_id: str,
        constraints: Sequence[Constraint],
        *,
        expected_version: int,
    ) -> bool:
        """Replace the pinned constraints by compare-and-set on their version."""
        ...

    async def set_emotions(self, tenant: str, session_id: str, scores: Mapping[int, float]) -> None:
        """Record emotion intensities (0–1) for turns by sequence number (idempotent).

        Unknown sequence numbers and unknown sessions are ignored. Scores are
        derived data: the turn itself is never rewritten.
        """
        ...

    async def record_job(
        self, tenant: str, session_id: str, job: str, *, ok: bool, error: str | None = None
    ) -> None:
        """Count a background job's outcome in the session's stats (ignored for unknown sessions)."""
        ...


@runtime_checkable
class SessionAdmin(Protocol):
    async def info(self, tenant: str, session_id: str) -> SessionInfo | None:
        """The session's info, or ``None`` if the tenant has no such session."""
        ...

    async def list_sessions(
        self, tenant: str, *, limit: int = 100, offset: int = 0, user_id: str | None = None
    ) -> list[SessionInfo]:
        """The tenant's sessions (only ``user_id``'s when given), most recently updated first."""
        ...

    async def delete(self, tenant: str, session_id: str) -> bool:
        """Delete the session with all its turns and derived records; False if absent."""
        ...

    async def purge_idle(self, older_than: datetime) -> int:
        """Delete every session (any tenant) not updated since ``older_than``; return how many."""
        ...


@runtime_checkable
class JobLocks(Protocol):
    def lock(
        self, tenant: str, session_id: str, *, ttl_s: float = 60.0
    ) -> AbstractAsyncContextManager[LockHandle]:
        """Hold the session's job lock, or raise `LockNotAcquired` at once if another holds it.

        The lock expires ``ttl_s`` seconds after acquisition if its holder dies.
        Releasing checks the fencing token, so a holder whose lock expired and
        was taken over never releases its successor's lock.
        """
        ...


@runtime_checkable
class Store(TurnLog, DerivedRecords, SessionAdmin, JobLocks, Protocol):
    """A complete backend: memory, SQLite, PostgreSQL or Redis."""

    async def close(self) -> None:
        """Release connections and files."""
        ...


class ClosesOnExit:
    """Mixin: ``async with backend:`` returns the backend and awaits its `close` on exit."""

    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
