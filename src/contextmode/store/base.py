"""The `Store` seam: an append-only turn log plus versioned derived records.

A store is four small protocols in one object:

- `TurnLog`: compare-and-set appends and bounded reads of the log;
- `DerivedRecords`: summary, pinned constraints and emotion scores, each a
  record that says which turns it covers and is committed by compare-and-set;
- `SessionAdmin`: listing, info, deletion and retention;
- `JobLocks`: a per-session lock, single-flight across processes, that expires
  when its holder dies, with a fencing token.

Two optional protocols the HTTP service uses when a backend offers them (all
shipped backends do): `TurnLocks`, a second per-session lock held for the
whole of one chat turn so concurrent turns of a session never interleave, and
`IdempotencyRecords`, the per-tenant ``Idempotency-Key`` records that make a
retried request replay its first result instead of storing the turn twice.

`TraceRecords` is an optional fifth ability (every shipped backend has it,
`keeps_traces` tells): the kept trace of each exchange, what the model received.

`SharesConnection` (every shipped backend has it; only PostgreSQL's does anything)
lets a task's calls in a row share one pooled connection: `one_connection` takes it
at the first statement, `let_go` hands it back early. A turn and a burst of background
jobs use it (`one_connection`, `let_go`), and let go before anything that may call a model
works (`engine.seams.SafeWithSharedConnection`) and before any pause.

Every session call takes a `SessionKey` (a tenant and a session id, checked once where the key
was made); tenant-wide calls take the tenant. The store callers hold is a front
(`store.front`) over a backend's driver. Turns are never rewritten or deleted except by
erasing the whole session or by a retention policy's turn limit (the lifecycle
abilities in `store.lifecycle`, docs/lifecycle.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from typing import Generic, Protocol, Self, TypeGuard, TypeVar, runtime_checkable

from .._protocols import implements
from ..errors import SessionNotFound, TurnNotFound
from ..types import Constraint, NewTurn, SessionKey, SessionState, Summary, Turn
from .records import TurnTrace

__all__ = [
    "ClosesOnExit",
    "DerivedRecords",
    "IdempotencyRecord",
    "IdempotencyRecords",
    "JobLocks",
    "JobOutcome",
    "JobOutcomes",
    "JobStats",
    "LockHandle",
    "OwnConnections",
    "SessionAdmin",
    "SessionInfo",
    "SessionVersion",
    "SharesConnection",
    "Store",
    "StoreAbility",
    "TraceRecords",
    "TurnLocks",
    "TurnLog",
    "counts_job_batches",
    "keeps_idempotency",
    "keeps_traces",
    "let_go",
    "load_trace",
    "one_connection",
    "shares_connection",
]


@dataclass(frozen=True, kw_only=True)
class JobStats:
    """Outcome counters of one kind of background job for one session."""

    ok: int = 0
    failed: int = 0
    rejected: int = 0
    """Runs whose model output was unusable (schema, invented values): nothing was stored."""
    last_error: str | None = None
    """Message of the last failure or rejection reason (no secrets), ``None`` after a success."""
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
        key: SessionKey,
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
        key: SessionKey,
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
        self, key: SessionKey, *, from_seq: int = 1, to_seq: int | None = None
    ) -> list[Turn]:
        """Turns with ``from_seq <= seq <= to_seq``, oldest first."""
        ...

    async def version(self, key: SessionKey) -> SessionVersion:
        """A one-row probe of the session's counters (all 0 for an unknown session).

        Caches compare it with the probe taken at load time to never serve a
        state another process has changed since.
        """
        ...


@runtime_checkable
class DerivedRecords(Protocol):
    async def commit_summary(
        self, key: SessionKey, summary: Summary, *, expected_version: int
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
        key: SessionKey,
        constraints: Sequence[Constraint],
        *,
        expected_version: int,
    ) -> bool:
        """Replace the pinned constraints by compare-and-set on their version."""
        ...

    async def set_emotions(self, key: SessionKey, scores: Mapping[int, float]) -> None:
        """Record emotion intensities (0–1) for turns by sequence number (idempotent).

        Unknown sequence numbers and unknown sessions are ignored. Scores are
        derived data: the turn itself is never rewritten.
        """
        ...

    async def record_job(
        self, key: SessionKey, job: str, *, ok: bool, error: str | None = None,
        rejected: bool = False,
    ) -> None:
        """Count a background job's outcome in the session's stats (ignored for unknown sessions):
        ``ok``, else ``rejected`` (the model's output was unusable; ``error`` is the reason) or failed."""
        ...


@dataclass(frozen=True, kw_only=True, slots=True)
class JobOutcome:
    """One background job's outcome, as `DerivedRecords.record_job` counts it."""

    job: str
    ok: bool
    error: str | None = None
    rejected: bool = False
    finished_at: datetime
    """When the job ended (the stats' ``last_run``)."""


@runtime_checkable
class JobOutcomes(Protocol):
    """Optional: several job outcomes of one session counted in one write (the job runner
    counts a burst of jobs at once on a store that has it; PostgreSQL does)."""

    async def record_jobs(
        self, key: SessionKey, outcomes: Sequence[JobOutcome], *, release: LockHandle | None = None
    ) -> None:
        """`DerivedRecords.record_job` for each outcome, in order, in one write; with ``release``
        (a job lock of this store) that lock is released (fencing-checked) in the same write, and
        leaving its context then writes nothing more."""
        ...


def counts_job_batches(store: object) -> TypeGuard[JobOutcomes]:
    """True when ``store`` counts several job outcomes in one write (`JobOutcomes`)."""
    return implements(store, JobOutcomes)


@runtime_checkable
class SessionAdmin(Protocol):
    async def info(self, key: SessionKey) -> SessionInfo | None:
        """The session's info, or ``None`` if the tenant has no such session."""
        ...

    async def list_sessions(
        self, tenant: str, *, limit: int = 100, offset: int = 0, user_id: str | None = None
    ) -> list[SessionInfo]:
        """The tenant's sessions (only ``user_id``'s when given), most recently updated first."""
        ...

    async def delete(self, key: SessionKey) -> bool:
        """Delete the session with all its turns and derived records; False if absent."""
        ...

    async def purge_idle(self, older_than: datetime) -> int:
        """Delete every session (any tenant) not updated since ``older_than``; return how many."""
        ...


@runtime_checkable
class JobLocks(Protocol):
    def lock(
        self, key: SessionKey, *, ttl_s: float = 60.0
    ) -> AbstractAsyncContextManager[LockHandle]:
        """Hold the session's job lock, or raise `LockNotAcquired` at once if another holds it.

        The lock expires ``ttl_s`` seconds after acquisition if its holder dies.
        Releasing checks the fencing token, so a holder whose lock expired and
        was taken over never releases its successor's lock.
        """
        ...


@runtime_checkable
class TurnLocks(Protocol):
    def turn_lock(
        self, key: SessionKey, *, ttl_s: float = 300.0
    ) -> AbstractAsyncContextManager[LockHandle]:
        """Hold the session's turn lock (not the job lock), or raise `LockNotAcquired` at once.

        Held for one chat turn, from loading the session to storing the answer, so
        two turns of one session never run at the same time, in any process.
        Expires ``ttl_s`` seconds after acquisition if its holder dies.
        """
        ...

    async def release_turn_lock(self, handle: LockHandle) -> None:
        """Release a turn lock whose context exit could not reach the store (fencing-checked)."""
        ...


@dataclass(frozen=True, kw_only=True)
class IdempotencyRecord:
    """What a tenant's ``Idempotency-Key`` stands for."""

    fingerprint: str
    """Digest of the first request (route, session and body); another body is refused."""
    status: int
    """HTTP status of the stored response; 0 while the first request is still running."""
    response: str
    """The stored response (JSON text, the service decides its shape); empty while running."""


@runtime_checkable
class IdempotencyRecords(Protocol):
    async def claim_idempotency(
        self, tenant: str, key: str, fingerprint: str, *, session_id: str, lease_s: float
    ) -> IdempotencyRecord | None:
        """Record ``key`` as running for ``session_id`` and return ``None``; or return the live record it has.

        Keys are per tenant: ``session_id`` does not scope the key, it ties the
        record (which holds the session's text once finished) to the session, so
        erasing the session (`store.lifecycle.Erasure`) erases the record too.
        A running record lapses after ``lease_s`` (its worker died), a finished one
        at the ``ttl_s`` given to `finish_idempotency`; a lapsed record counts as absent.
        """
        ...

    async def finish_idempotency(
        self, tenant: str, key: str, *, status: int, response: str, ttl_s: float
    ) -> None:
        """Store the response of ``key``'s request, kept ``ttl_s`` seconds."""
        ...

    async def release_idempotency(self, tenant: str, key: str) -> None:
        """Forget ``key`` (its request stored nothing, so a retry may run again)."""
        ...


def keeps_idempotency(store: object) -> TypeGuard[IdempotencyRecords]:
    """True when ``store`` keeps the records of ``Idempotency-Key`` requests."""
    return implements(store, IdempotencyRecords)


@runtime_checkable
class Store(TurnLog, DerivedRecords, SessionAdmin, JobLocks, Protocol):
    """A complete backend: memory, SQLite, PostgreSQL or Redis."""

    async def close(self) -> None:
        """Release connections and files."""
        ...


@runtime_checkable
class TraceRecords(Protocol):
    """Kept traces of exchanges, one per (session, turn number); deleted with the session."""

    async def put_trace(
        self,
        key: SessionKey,
        trace: TurnTrace,
        *,
        keep: int = 0,
        older_than: datetime | None = None,
    ) -> None:
        """Keep ``trace`` under ``trace.turn`` (replacing a trace with that number).

        Then drop the session's traces beyond the newest ``keep`` turn numbers
        (0 = no count limit) and those created before ``older_than`` (a backend
        may look only at its oldest few per call, so each write stays O(1);
        traces are written in turn order, so nothing old is missed for long).
        Ignored for an unknown session (a trace never creates one).
        """
        ...

    async def get_trace(self, key: SessionKey, turn: int) -> TurnTrace | None:
        """The trace of exchange ``turn``, or ``None`` (never kept, pruned or deleted)."""
        ...

    async def delete_traces(self, key: SessionKey) -> int:
        """Delete every trace of the session (turns stay); return how many were deleted."""
        ...


def keeps_traces(store: object) -> TypeGuard[TraceRecords]:
    """True when ``store`` keeps per-turn traces (all shipped backends do)."""
    return implements(store, TraceRecords)


_Ability = TypeVar("_Ability")


class StoreAbility(Generic[_Ability]):
    """An optional ability of a store, checked once per store object rather than per turn
    (a runtime Protocol check costs tens of microseconds); a store swapped later is checked
    again."""

    def __init__(self, check: Callable[[object], TypeGuard[_Ability]], store: object) -> None:
        self._check = check
        self._store = store
        self._ability: _Ability | None = store if check(store) else None

    def of(self, store: object) -> _Ability | None:
        """``store`` as the ability, or ``None`` when it lacks it."""
        if store is not self._store:
            self._store, self._ability = store, store if self._check(store) else None
        return self._ability


@runtime_checkable
class SharesConnection(Protocol):
    """A store whose calls in a row can share one pooled connection (PostgreSQL; the other
    shipped stores have no pool and do nothing, `OwnConnections`).

    Inside `one_connection` the calls this task makes run on one connection (no transaction),
    taken at the scope's first statement, not on entry; `let_go` hands it back at once (the
    next statement in the scope takes a fresh one). Tasks started inside take their own. A
    scope inside a scope is the outer one. Hold it only while the task talks to the store:
    let go before waiting on anything else (a model, a lock's back-off), or other tasks
    queue for the pool."""

    def one_connection(self) -> AbstractAsyncContextManager[None]:
        """Within this context, the calls this task makes share one pooled connection."""
        ...

    async def let_go(self) -> None:
        """Hand the connection this task's scope holds back to the pool now (none held, or
        no scope: nothing)."""
        ...


def shares_connection(store: object) -> TypeGuard[SharesConnection]:
    """True when ``store`` can share one pooled connection across calls (`SharesConnection`)."""
    return implements(store, SharesConnection)


class OwnConnections:
    """Mixin: `SharesConnection` for a store with nothing to share (memory; SQLite's one
    connection; Redis, whose client takes a pooled connection per command): the scope and
    `let_go` do nothing."""

    def one_connection(self) -> AbstractAsyncContextManager[None]:
        return nullcontext()

    async def let_go(self) -> None:
        return None


def one_connection(store: object) -> AbstractAsyncContextManager[None]:
    """``store.one_connection()`` when it `SharesConnection`, else a context that does nothing."""
    return store.one_connection() if shares_connection(store) else nullcontext()


async def let_go(store: object) -> None:
    """``store.let_go()`` when it `SharesConnection`, else nothing."""
    if shares_connection(store):
        await store.let_go()


async def load_trace(store: Store, key: SessionKey, turn: int) -> TurnTrace:
    """The kept trace of exchange ``turn``; `SessionNotFound` / `TurnNotFound` otherwise.

    Shared by the HTTP route and ``contextmode inspect --turn`` so both answer alike.
    """
    keeper: object = store
    if not keeps_traces(keeper):
        raise TurnNotFound("this store keeps no per-turn context")
    trace = await keeper.get_trace(key, turn)
    if trace is not None:
        return trace
    info = await store.info(key)
    if info is None:
        raise SessionNotFound(f"no session {key.session_id!r}")
    raise TurnNotFound(
        f"no kept context for turn {turn} of session {key.session_id!r}: turns count user messages "
        "from 1; a turn's context is kept only for live turns, within the retention setting "
        "(CONTEXTMODE_TRACE_KEEP, CONTEXTMODE_TRACE_MAX_AGE_DAYS); it is written just after the "
        "reply, so a turn whose process stopped at that moment is stored without it"
    )


class ClosesOnExit:
    """Mixin: ``async with backend:`` returns the backend and awaits its `close` on exit."""

    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
