"""The template for a fifth backend: a driver with only the core the store front needs.

`MinimalDriver` keeps everything in this process's memory and writes the 15 methods of the
core (`store.drivers.Driver` and `store.drivers.KeyedRecords`), nothing more. Its front,
``StoreFront(MinimalDriver())``, passes the store contract (`testing.contract`) and the
lifecycle contract except the two calls the core cannot express (erasing a prefix of a
session's turns and restoring a session's owner and times: see docs/storage.md, "Writing a
backend"); locks, job counters, traces, idempotency records, users, purging, erasure and the
deletion log are the front's, kept through `KeyedRecords` (`store.kept`).

To write a backend: copy this file, keep each method's promise (its docstring; the `Store`
protocols say the rest) in one atomic step of your storage (a transaction, a conditional
write, a script), run the contracts with ``StoreFront(YourDriver(...))``, then add the
optional abilities (`store.drivers`) your storage does faster natively. Every id it is given
is checked already; it checks none.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from ..errors import ConflictError
from ..types import Constraint, SessionState, Summary, Turn, utc_now
from ._codec import check_owner, window_start
from .base import SessionInfo, SessionVersion
from .postings import AppendInput

__all__ = ["MinimalDriver"]


@dataclass
class _Session:
    """One session: its log and the records derived from it (one row of a table, one hash…)."""

    created_at: datetime
    updated_at: datetime
    user_id: str | None = None
    turns: list[Turn] = field(default_factory=list)
    summary: Summary | None = None
    constraints: tuple[Constraint, ...] = ()
    constraints_version: int = 0
    emotions_version: int = 0
    last_answer: str | None = None


class MinimalDriver:
    """The core driver in memory: one process, nothing persisted (`store.minimal`)."""

    def __init__(self) -> None:
        self._sessions: dict[tuple[str, str], _Session] = {}
        self._records: dict[tuple[str, str, str], tuple[bytes, float | None]] = {}
        """(tenant, kind, key) → (value, when it expires on `time.time`, None: never)."""
        self._write = asyncio.Lock()
        """One writer at a time: this driver's "transaction"."""

    async def close(self) -> None:
        """Release connections and files (none here)."""
        return None

    # -- the log ---------------------------------------------------------------------

    async def append(self, given: AppendInput, *, expected_last_seq: int | None = None) -> list[Turn]:
        """Append ``given.turns`` after the last seq, in one atomic step: `ConflictError` when
        ``expected_last_seq`` differs; the owner checked (`check_owner`) before anything is
        written; nothing written for no turns; the session created if new; the last answer
        set; ``updated_at`` moved."""
        async with self._write:
            session = self._sessions.get(given.key)
            last_seq = len(session.turns) if session else 0
            if expected_last_seq is not None and expected_last_seq != last_seq:
                raise ConflictError(
                    f"session {given.key[1]!r} is at seq {last_seq}, expected {expected_last_seq}"
                )
            check_owner(session.user_id if session else None, given.user_id, given.key[1])
            if not given.turns:
                return []
            now = utc_now()
            if session is None:
                session = self._sessions[given.key] = _Session(created_at=now, updated_at=now)
            session.user_id = session.user_id or given.user_id
            stored = [
                Turn(seq=last_seq + i, role=t.role, content=t.content, tokens=t.tokens,
                     created_at=t.created_at, emotion=t.emotion, metadata=dict(t.metadata))
                for i, t in enumerate(given.turns, start=1)
            ]
            session.turns.extend(stored)
            session.emotions_version += any(t.emotion is not None for t in stored)
            answers = [t.content for t in stored if t.role == "assistant"]
            session.last_answer = answers[-1] if answers else session.last_answer
            session.updated_at = now
            return stored

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
        """The turns from `window_start` on, the summary, pins and last answer, and up to
        ``key_moments`` older turns with emotion ≥ the threshold (strongest, then newest,
        first; returned oldest first). An unknown session: an empty state."""
        session = self._sessions.get((tenant, session_id))
        if session is None:
            return SessionState(tenant=tenant, session_id=session_id)
        last_seq = len(session.turns)
        covers = session.summary.covers_seq if session.summary else 0
        tail = session.turns[window_start(last_seq, covers, recent, max_uncovered) - 1 :]
        first_tail = tail[0].seq if tail else last_seq + 1
        older = [t for t in session.turns[: first_tail - 1]
                 if t.emotion is not None and t.emotion >= key_moment_threshold]
        older.sort(key=lambda t: (t.emotion or 0.0, t.seq), reverse=True)
        moments = sorted(older[: max(key_moments, 0)], key=lambda t: t.seq)
        return SessionState(
            tenant=tenant, session_id=session_id, last_seq=last_seq, turns=tuple(tail),
            summary=session.summary, constraints=session.constraints,
            constraints_version=session.constraints_version, key_moments=tuple(moments),
            last_answer=session.last_answer, created_at=session.created_at,
            updated_at=session.updated_at,
        )

    async def turns(
        self, tenant: str, session_id: str, *, from_seq: int = 1, to_seq: int | None = None
    ) -> list[Turn]:
        """Turns with ``from_seq <= seq <= to_seq``, oldest first."""
        session = self._sessions.get((tenant, session_id))
        if session is None:
            return []
        end = len(session.turns) if to_seq is None else min(to_seq, len(session.turns))
        return session.turns[max(0, from_seq - 1) : max(0, end)]

    async def version(self, tenant: str, session_id: str) -> SessionVersion:
        """The counters `load` depends on, and the creation time (all zero when absent)."""
        session = self._sessions.get((tenant, session_id))
        if session is None:
            return SessionVersion()
        return SessionVersion(
            last_seq=len(session.turns),
            summary_version=session.summary.version if session.summary else 0,
            constraints_version=session.constraints_version,
            emotions_version=session.emotions_version,
            created_at=session.created_at,
        )

    # -- derived records ---------------------------------------------------------------

    async def commit_summary(
        self, tenant: str, session_id: str, summary: Summary, *, expected_version: int
    ) -> bool:
        """Store ``summary`` as version ``expected_version + 1`` if the stored version is
        ``expected_version`` and it covers more turns than the stored one, none past the log."""
        async with self._write:
            session = self._sessions.get((tenant, session_id))
            if session is None:
                return False
            current = session.summary
            version, covers = (current.version, current.covers_seq) if current else (0, 0)
            if version != expected_version or not covers < summary.covers_seq <= len(session.turns):
                return False
            session.summary = replace(summary, version=version + 1)
            return True

    async def commit_constraints(
        self,
        tenant: str,
        session_id: str,
        constraints: Sequence[Constraint],
        *,
        expected_version: int,
    ) -> bool:
        """Replace the pins if their version is ``expected_version`` (then it grows by one)."""
        async with self._write:
            session = self._sessions.get((tenant, session_id))
            if session is None or session.constraints_version != expected_version:
                return False
            session.constraints = tuple(constraints)
            session.constraints_version += 1
            return True

    async def set_emotions(self, tenant: str, session_id: str, scores: Mapping[int, float]) -> None:
        """Score existing turns; the emotions version grows when a score changed."""
        async with self._write:
            session = self._sessions.get((tenant, session_id))
            if session is None:
                return
            changed = False
            for seq, score in scores.items():
                if 1 <= seq <= len(session.turns) and session.turns[seq - 1].emotion != score:
                    session.turns[seq - 1] = replace(session.turns[seq - 1], emotion=float(score))
                    changed = True
            session.emotions_version += changed

    # -- sessions ------------------------------------------------------------------------

    @staticmethod
    def _info(key: tuple[str, str], session: _Session) -> SessionInfo:
        return SessionInfo(
            tenant=key[0], session_id=key[1], last_seq=len(session.turns),
            created_at=session.created_at, updated_at=session.updated_at,
            summary_covers_seq=session.summary.covers_seq if session.summary else 0,
            summary_version=session.summary.version if session.summary else 0,
            constraints_version=session.constraints_version, user_id=session.user_id,
        )

    async def info(self, tenant: str, session_id: str) -> SessionInfo | None:
        """The session's info (no job counters: the front keeps those), or ``None``."""
        session = self._sessions.get((tenant, session_id))
        return None if session is None else self._info((tenant, session_id), session)

    async def list_sessions(
        self, tenant: str, *, limit: int = 100, offset: int = 0, user_id: str | None = None
    ) -> list[SessionInfo]:
        """The tenant's sessions (``user_id``'s only, when given), most recently updated first."""
        mine = [(k, s) for k, s in self._sessions.items()
                if k[0] == tenant and (user_id is None or s.user_id == user_id)]
        mine.sort(key=lambda ks: ks[1].updated_at, reverse=True)
        return [self._info(k, s) for k, s in mine[offset : offset + limit]]

    async def list_tenants(self) -> list[str]:
        """Every tenant with a session, sorted."""
        return sorted({tenant for tenant, _ in self._sessions})

    async def delete(self, tenant: str, session_id: str) -> bool:
        """Delete the session and everything `load` and `info` show of it; False if absent."""
        async with self._write:
            return self._sessions.pop((tenant, session_id), None) is not None

    # -- keyed records ---------------------------------------------------------------------

    def _live(self, where: tuple[str, str, str]) -> bytes | None:
        kept = self._records.get(where)
        if kept is None or (kept[1] is not None and kept[1] <= time.time()):
            return None
        return kept[0]

    async def get_record(self, tenant: str, kind: str, key: str) -> bytes | None:
        """The record's value; ``None`` when absent or expired."""
        return self._live((tenant, kind, key))

    async def swap_record(
        self,
        tenant: str,
        kind: str,
        key: str,
        old: bytes | None,
        new: bytes | None,
        *,
        ttl_s: float | None = None,
    ) -> bool:
        """If the value is ``old`` (``None``: absent or expired), make it ``new`` (``None``:
        delete), expiring ``ttl_s`` from now; atomic (a conditional write, a script)."""
        where = (tenant, kind, key)
        async with self._write:
            if self._live(where) != old:
                return False
            if new is None:
                self._records.pop(where, None)
            else:
                self._records[where] = (new, None if ttl_s is None else time.time() + ttl_s)
            return True

    async def list_records(self, tenant: str, kind: str, prefix: str = "") -> list[tuple[str, bytes]]:
        """Live ``(key, value)`` of ``(tenant, kind)`` whose key starts with ``prefix``, in key order."""
        found = [(key, self._live((t, k, key))) for (t, k, key) in self._records
                 if t == tenant and k == kind and key.startswith(prefix)]
        return sorted((key, value) for key, value in found if value is not None)
