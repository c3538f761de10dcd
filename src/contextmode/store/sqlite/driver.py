"""The SQLite store: the embedded default, one file under ``CONTEXTMODE_HOME``.

Stdlib `sqlite3` runs on one private thread per store. The file is in WAL mode;
every write is a ``BEGIN IMMEDIATE`` transaction, so writers from many processes
queue on SQLite's own lock (with a busy timeout) instead of failing on a
read-to-write upgrade. Job locks are a table with an expiry time in the same file.

The few small statements of a turn's reply path (the session's turn lock, its
load, the two appends, the trace write just after the reply, idempotency
records) first try a second connection on the
event loop's own thread (`_run_quick`): it has no busy timeout and never
checkpoints, so it never waits. If the file is locked by any writer (this
process's thread or another process) the call goes to the private thread and
waits there as every call does. A thread hand-off costs more than these
statements on a loaded host; big reads and background writes stay on the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from datetime import datetime
from os import PathLike
from pathlib import Path
from typing import Any, TypeVar

from ...errors import ConfigError, ConflictError, StoreError
from ...types import Constraint, SessionState, Summary, Turn
from .._codec import (
    check_owner,
    constraints_from_json,
    constraints_to_json,
    from_micros,
    last_answer,
    metadata_json,
    now_micros,
    summary_fields,
    to_micros,
    window_start,
)
from ..base import (
    ClosesOnExit,
    IdempotencyRecord,
    LockHandle,
    OwnConnections,
    SessionInfo,
    SessionVersion,
)
from ..postings import AppendInput, IndexStats, completes_block
from ..records import TurnTrace
from ..trace_pack import pack_trace_soon
from ..usage import sqlite_session_bytes
from . import admin, postings, traces
from .lifecycle import SQLiteLifecycle
from .rows import TURN_SELECT
from .rows import turn as turn_row
from .schema import migrate

__all__ = ["SQLiteDriver"]

T = TypeVar("T")
Db = sqlite3.Connection

_SESSION_COLS = (
    "last_seq, created_at, updated_at, last_answer, summary_text, summary_covers_seq,"
    " summary_tokens, summary_version, summary_created_at, constraints, constraints_version,"
    " emotions_version"
)


_QUICK_CHECKPOINT_EVERY = 500
"""The loop's connection never checkpoints; after this many of its writes the private
thread runs a passive checkpoint (its own writes also do, past 1000 WAL pages)."""


def _busy(exc: sqlite3.Error) -> bool:
    """The file is locked by another connection (``SQLITE_BUSY``/``SQLITE_LOCKED``, any variant)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _passive_checkpoint(db: Db) -> None:
    db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()


def _summary(row: Sequence[Any]) -> Summary | None:
    if not row[7]:
        return None
    return Summary(
        text=row[4], covers_seq=row[5], tokens=row[6], version=row[7], created_at=from_micros(row[8])
    )


class _OffTheLoop(Exception):
    """Raised by a body on the event loop's connection that must run on the private thread
    instead (e.g. an append that merges a block of the recall index, ~0.2–0.5 s)."""


class SQLiteDriver(SQLiteLifecycle, OwnConnections, ClosesOnExit):
    """A `Store` in one SQLite file; safe for many processes on one host.

    ``synchronous`` is SQLite's ``PRAGMA synchronous``: ``NORMAL`` (default)
    survives any process crash; ``FULL`` also survives power loss, slower.
    ``busy_timeout_s`` is how long a writer waits for another's lock (seconds).
    """

    def __init__(
        self,
        path: str | PathLike[str],
        *,
        busy_timeout_s: float = 30.0,
        synchronous: str = "NORMAL",
    ) -> None:
        self.path = str(path)
        self._busy_timeout_s = busy_timeout_s
        self._synchronous = synchronous.upper()
        if self._synchronous not in {"OFF", "NORMAL", "FULL", "EXTRA"}:
            raise ConfigError(f"invalid synchronous mode {synchronous!r}")
        self._db: Db | None = None
        self._closed = False
        # One thread owns the connection: calls are serialised without a lock.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="contextmode-sqlite")
        # The event loop's own connection (`_run_quick`): only for a file (a second
        # connection to ":memory:" would be another database) and without fsync at commit.
        self._quick_ok = self.path not in ("", ":memory:") and self._synchronous in {"OFF", "NORMAL"}
        self._quick: Db | None = None
        self._quick_thread = 0
        self._quick_writes = 0

    # -- plumbing ---------------------------------------------------------------

    def _connect(self) -> Db:
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(
            self.path, timeout=self._busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        try:
            db.execute("PRAGMA journal_mode=WAL")
            # Erased rows are overwritten with zeros, not just unlinked (docs/lifecycle.md).
            db.execute("PRAGMA secure_delete=ON")
            db.execute(f"PRAGMA synchronous={self._synchronous}")
            migrate(db)
        except BaseException:
            db.close()
            raise
        return db

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        # The one place sqlite3 errors become StoreError.
        try:
            if self._db is None:
                self._db = self._connect()
            return fn(self._db, *args)
        except sqlite3.Error as exc:
            raise StoreError(f"SQLite store {self.path!r} failed: {exc}") from exc

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise StoreError(f"SQLite store {self.path!r} is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(self._call, fn, *args))

    def _quick_db(self) -> Db | None:
        """The calling thread's quick connection, opened on first use; ``None`` when calls
        must go to the private thread (memory database, FULL sync, another thread, not
        yet migrated by the private thread, or the file refused a second connection)."""
        if not self._quick_ok or self._db is None:
            return None
        if self._quick is not None:
            return self._quick if self._quick_thread == threading.get_ident() else None
        try:
            db = sqlite3.connect(self.path, timeout=0, isolation_level=None, check_same_thread=False)
        except sqlite3.Error:
            self._quick_ok = False
            return None
        try:
            # No busy handler (timeout 0): a locked file answers at once. Never checkpoint
            # here (that can fsync): the private thread does (`_QUICK_CHECKPOINT_EVERY`).
            db.execute("PRAGMA secure_delete=ON")
            db.execute(f"PRAGMA synchronous={self._synchronous}")
            db.execute("PRAGMA wal_autocheckpoint=0")
            wal = str(db.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal"
        except sqlite3.Error as exc:
            db.close()
            self._quick_ok = self._quick_ok and _busy(exc)  # locked now: try again next call
            return None
        if not wal:  # outside WAL mode readers block writers and commits fsync: thread only
            db.close()
            self._quick_ok = False
            return None
        self._quick, self._quick_thread = db, threading.get_ident()
        return db

    def _drop_quick(self) -> None:
        """Close the quick connection (it could not end a transaction); the next call opens another."""
        if self._quick is not None:
            self._quick.close()
            self._quick = None

    async def _run_quick(self, fn: Callable[..., T], *args: Any, writes: bool = False) -> T:
        """`_run` for a small statement of the reply path: on the event loop's connection when
        the file is free (no thread hand-off), else on the private thread, waiting there."""
        if self._closed:
            raise StoreError(f"SQLite store {self.path!r} is closed")
        db = self._quick_db()
        if db is None:
            return await self._run(fn, *args)
        try:
            result = fn(db, *args)
        except _OffTheLoop:  # the body rolled its transaction back before it wrote anything
            return await self._run(fn, *args)
        except sqlite3.Error as exc:
            if db.in_transaction:  # `admin.write`/`read` end theirs; a bare statement has none
                try:
                    db.execute("ROLLBACK")
                except sqlite3.Error:
                    self._drop_quick()
            if not _busy(exc):
                raise StoreError(f"SQLite store {self.path!r} failed: {exc}") from exc
            return await self._run(fn, *args)  # locked: wait for the writer on the thread
        if writes:
            self._quick_writes += 1
            if self._quick_writes % _QUICK_CHECKPOINT_EVERY == 0:
                with contextlib.suppress(StoreError):  # the write is committed; the WAL can wait
                    await self._run(_passive_checkpoint)
        return result

    async def close(self) -> None:
        def _close(db: Db) -> None:
            db.close()
            self._db = None

        if self._closed:
            return
        self._drop_quick()
        if self._db is not None:
            await self._run(_close)
        self._closed = True
        self._executor.shutdown(wait=True)

    # -- turn log ---------------------------------------------------------------

    async def append(self, given: AppendInput, *, expected_last_seq: int | None = None) -> list[Turn]:
        key, user_id, turns, analyzed = given.key, given.user_id, given.turns, given.analyzed
        session_id = key[1]
        now = now_micros()
        answer = last_answer(turns)

        def body(db: Db) -> tuple[int, list[Turn]]:
            row = db.execute(f"SELECT last_seq, user_id FROM sessions {admin.WHERE}", key).fetchone()
            last = row[0] if row else 0
            if expected_last_seq is not None and expected_last_seq != last:
                raise ConflictError(
                    f"session {session_id!r} is at seq {last}, expected {expected_last_seq}"
                )
            check_owner(row[1] if row else None, user_id, session_id)
            if not turns:
                return last, []
            if db is self._quick and completes_block(last + 1, last + len(turns)):
                raise _OffTheLoop  # this append merges a recall block: too long for the loop
            if row is None:
                db.execute(
                    "INSERT INTO sessions (tenant, session_id, created_at, updated_at, user_id)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (*key, now, now, user_id),
                )
            elif row[1] is None and user_id is not None:
                db.execute(f"UPDATE sessions SET user_id = ? {admin.WHERE}", (user_id, *key))
            db.executemany(
                "INSERT INTO turns (tenant, session_id, seq, role, content, tokens, created_at,"
                " metadata) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (*key, last + i, t.role, t.content, t.tokens, to_micros(t.created_at),
                     metadata_json(t.metadata))
                    for i, t in enumerate(turns, start=1)
                ],
            )
            db.executemany(
                "INSERT INTO turn_emotions (tenant, session_id, seq, emotion) VALUES (?, ?, ?, ?)",
                [
                    (*key, last + i, float(t.emotion))
                    for i, t in enumerate(turns, start=1)
                    if t.emotion is not None
                ],
            )
            answer_seq = max(
                (last + i for i, t in enumerate(turns, start=1) if t.role == "assistant"), default=0
            )
            db.execute(
                "UPDATE sessions SET last_seq = ?, updated_at = ?,"
                " last_answer = CASE WHEN ? > 0 THEN ? ELSE last_answer END,"
                " last_answer_seq = MAX(last_answer_seq, ?),"
                " emotions_version = emotions_version + ?"
                f" {admin.WHERE}",
                (last + len(turns), now, answer_seq, answer, answer_seq,
                 int(any(t.emotion is not None for t in turns)), *key),
            )
            numbered = [
                Turn(
                    seq=last + i,
                    role=t.role,
                    content=t.content,
                    tokens=t.tokens,
                    created_at=from_micros(to_micros(t.created_at)),
                    emotion=None if t.emotion is None else float(t.emotion),
                    metadata=dict(t.metadata),
                )
                for i, t in enumerate(turns, start=1)
            ]
            postings.index_turns(db, key, numbered, last, analyzed)  # same transaction as the turns
            return last, numbered

        _, numbered = await self._run_quick(lambda db: admin.write(db, lambda: body(db)), writes=True)
        return numbered

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
        key = (tenant, session_id)

        def body(db: Db) -> SessionState:
            row = db.execute(f"SELECT {_SESSION_COLS} FROM sessions {admin.WHERE}", key).fetchone()
            if row is None:
                return SessionState(tenant=tenant, session_id=session_id)
            first = window_start(row[0], row[5], recent, max_uncovered)
            tail = [turn_row(r) for r in db.execute(f"{TURN_SELECT} AND t.seq >= ? ORDER BY t.seq",
                                                 (*key, first))]
            moments: list[Turn] = []
            if key_moments > 0:
                # Walks the (tenant, session, emotion, seq) index from the strongest down.
                seqs = [
                    r[0]
                    for r in db.execute(
                        "SELECT seq FROM turn_emotions WHERE tenant = ? AND session_id = ?"
                        " AND emotion >= ? AND seq < ? ORDER BY emotion DESC, seq DESC LIMIT ?",
                        (*key, key_moment_threshold, first, key_moments),
                    )
                ]
                for seq in sorted(seqs):
                    moment = db.execute(f"{TURN_SELECT} AND t.seq = ?", (*key, seq)).fetchone()
                    moments.append(turn_row(moment))
            return SessionState(
                tenant=tenant,
                session_id=session_id,
                last_seq=row[0],
                turns=tuple(tail),
                summary=_summary(row),
                constraints=constraints_from_json(row[9]),
                constraints_version=row[10],
                key_moments=tuple(moments),
                last_answer=row[3],
                created_at=from_micros(row[1]),
                updated_at=from_micros(row[2]),
            )

        return await self._run_quick(lambda db: admin.read(db, lambda: body(db)))

    async def turns(
        self, tenant: str, session_id: str, *, from_seq: int = 1, to_seq: int | None = None
    ) -> list[Turn]:
        key = (tenant, session_id)
        upper = to_seq if to_seq is not None else 2**62

        def body(db: Db) -> list[Turn]:
            rows = db.execute(
                f"{TURN_SELECT} AND t.seq >= ? AND t.seq <= ? ORDER BY t.seq",
                (*key, from_seq, upper),
            )
            return [turn_row(r) for r in rows]

        return await self._run(body)

    async def turns_at(self, tenant: str, session_id: str, seqs: Sequence[int]) -> list[Turn]:
        key = (tenant, session_id)
        wanted = sorted({int(s) for s in seqs})

        def body(db: Db) -> list[Turn]:
            out: list[Turn] = []
            for start in range(0, len(wanted), 500):
                part = wanted[start : start + 500]
                marks = ",".join("?" * len(part))
                rows = db.execute(f"{TURN_SELECT} AND t.seq IN ({marks}) ORDER BY t.seq", (*key, *part))
                out += [turn_row(r) for r in rows]
            return out

        return await self._run(lambda db: admin.read(db, lambda: body(db)))

    async def version(self, tenant: str, session_id: str) -> SessionVersion:
        key = (tenant, session_id)

        def body(db: Db) -> SessionVersion:
            row = db.execute(
                "SELECT last_seq, summary_version, constraints_version, emotions_version,"
                f" created_at FROM sessions {admin.WHERE}",
                key,
            ).fetchone()
            if row is None:
                return SessionVersion()
            return SessionVersion(
                last_seq=row[0], summary_version=row[1], constraints_version=row[2],
                emotions_version=row[3], created_at=from_micros(row[4]),
            )

        return await self._run_quick(body)

    # -- derived records --------------------------------------------------------

    async def commit_summary(
        self, tenant: str, session_id: str, summary: Summary, *, expected_version: int
    ) -> bool:
        key = (tenant, session_id)
        text, covers, tokens, created = summary_fields(summary)

        def body(db: Db) -> bool:
            # One guarded UPDATE: stale version, no progress or turns that do not exist yet
            # all leave the row untouched.
            cursor = db.execute(
                "UPDATE sessions SET summary_text = ?, summary_covers_seq = ?, summary_tokens = ?,"
                " summary_created_at = ?, summary_version = summary_version + 1"
                f" {admin.WHERE} AND summary_version = ? AND summary_covers_seq < ? AND last_seq >= ?",
                (text, covers, tokens, created, *key, expected_version, covers, covers),
            )
            return cursor.rowcount == 1

        return await self._run(body)

    async def commit_constraints(
        self,
        tenant: str,
        session_id: str,
        constraints: Sequence[Constraint],
        *,
        expected_version: int,
    ) -> bool:
        key = (tenant, session_id)
        encoded = constraints_to_json(constraints)

        def body(db: Db) -> bool:
            cursor = db.execute(
                "UPDATE sessions SET constraints = ?, constraints_version = constraints_version + 1"
                f" {admin.WHERE} AND constraints_version = ?",
                (encoded, *key, expected_version),
            )
            return cursor.rowcount == 1

        return await self._run(body)

    async def set_emotions(self, tenant: str, session_id: str, scores: Mapping[int, float]) -> None:
        key = (tenant, session_id)
        items = [(int(seq), float(score)) for seq, score in scores.items()]

        def body(db: Db) -> None:
            row = db.execute(f"SELECT last_seq FROM sessions {admin.WHERE}", key).fetchone()
            if row is None:
                return
            before = db.total_changes
            db.executemany(
                "INSERT INTO turn_emotions (tenant, session_id, seq, emotion) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (tenant, session_id, seq) DO UPDATE SET emotion = excluded.emotion"
                " WHERE emotion != excluded.emotion",
                [(*key, seq, score) for seq, score in items if 1 <= seq <= row[0]],
            )
            if db.total_changes != before:
                db.execute(
                    f"UPDATE sessions SET emotions_version = emotions_version + 1 {admin.WHERE}", key
                )

        await self._run(lambda db: admin.write(db, lambda: body(db)))

    async def record_job(
        self, tenant: str, session_id: str, job: str, *, ok: bool, error: str | None = None,
        rejected: bool = False,
    ) -> None:
        key = (tenant, session_id)

        def body(db: Db) -> None:
            db.execute(
                "INSERT INTO jobs (tenant, session_id, job, ok, failed, rejected, last_error, last_run)"
                f" SELECT ?, ?, ?, ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM sessions {admin.WHERE})"
                " ON CONFLICT (tenant, session_id, job) DO UPDATE SET ok = ok + excluded.ok,"
                " failed = failed + excluded.failed, rejected = rejected + excluded.rejected,"
                " last_error = excluded.last_error, last_run = excluded.last_run",
                (*key, job, int(ok), int(not ok and not rejected), int(not ok and rejected),
                 None if ok else error, now_micros(), *key),
            )

        await self._run(body)

    # -- administration ---------------------------------------------------------

    async def info(self, tenant: str, session_id: str) -> SessionInfo | None:
        return await self._run(admin.session_info, (tenant, session_id))

    async def list_sessions(
        self, tenant: str, *, limit: int = 100, offset: int = 0, user_id: str | None = None
    ) -> list[SessionInfo]:
        return await self._run(admin.list_sessions, tenant, limit, offset, user_id)

    async def delete(self, tenant: str, session_id: str) -> bool:
        return await self._run(admin.delete_session, (tenant, session_id))

    async def purge_idle(self, older_than: datetime) -> int:
        return await self._run(admin.purge_idle, to_micros(older_than))

    # -- kept traces ------------------------------------------------------------

    async def put_trace(
        self,
        tenant: str,
        session_id: str,
        trace: TurnTrace,
        *,
        keep: int = 0,
        older_than: datetime | None = None,
    ) -> None:
        cutoff = None if older_than is None else to_micros(older_than)
        # Written just after the reply: on the loop's connection when the file is free, so the
        # session's next turn does not find it locked by the private thread.
        key = (tenant, session_id)
        packed = await pack_trace_soon(trace)
        await self._run_quick(traces.put_trace, key, packed, keep, cutoff, writes=True)

    async def get_trace(self, tenant: str, session_id: str, turn: int) -> TurnTrace | None:
        return await self._run(traces.get_trace, (tenant, session_id), turn)

    async def delete_traces(self, tenant: str, session_id: str) -> int:
        return await self._run(traces.delete_traces, (tenant, session_id))

    async def session_bytes(self, tenant: str, session_id: str) -> dict[str, int]:
        """Bytes the session keeps by kind of record (`store.usage`)."""
        key = (tenant, session_id)
        return await self._run(lambda db: admin.read(db, lambda: sqlite_session_bytes(db, key)))

    # -- job locks --------------------------------------------------------------

    # -- recall index (store/postings.py) ----------------------------------------

    async def index_stats(self, tenant: str, session_id: str) -> IndexStats:
        key = (tenant, session_id)
        return await self._run(lambda db: postings.stats(db, key))

    async def postings(
        self, tenant: str, session_id: str, terms: Sequence[str], *, from_block: int = 0
    ) -> dict[str, list[tuple[int, bytes]]]:
        key = (tenant, session_id)
        return await self._run(
            lambda db: admin.read(db, lambda: postings.postings(db, key, list(terms), from_block))
        )

    async def term_counts(self, tenant: str, session_id: str, terms: Sequence[str]) -> dict[str, int]:
        key = (tenant, session_id)
        return await self._run(
            lambda db: admin.read(db, lambda: postings.term_counts(db, key, list(terms)))
        )

    async def query_postings(
        self, tenant: str, session_id: str, terms: Mapping[str, int], *,
        capped: Mapping[str, int], cap: int, most: int,
    ) -> tuple[dict[str, list[tuple[int, bytes]]], dict[str, int]]:
        key = (tenant, session_id)
        return await self._run(
            lambda db: admin.read(db, lambda: postings.query_postings(db, key, terms, capped, (cap, most)))
        )

    async def index_backfill(self, tenant: str, session_id: str, *, batch: int = 2000) -> int:
        key = (tenant, session_id)
        return await self._run(lambda db: admin.write(db, lambda: postings.backfill(db, key, batch)))

    async def sessions_to_index(self, *, limit: int = 1000) -> list[tuple[str, str, int, int]]:
        return await self._run(lambda db: postings.lagging(db, limit))

    @asynccontextmanager
    async def hold(self, key: str, ttl_s: float) -> AsyncIterator[LockHandle]:
        """Hold lock ``key`` (`store.front.Driver.hold`)."""
        token = await self._run_quick(admin.acquire_lock, key, ttl_s, writes=True)
        try:
            yield LockHandle(key=key, token=token)
        finally:
            await self._run_quick(admin.release_lock, key, token, writes=True)

    async def release(self, handle: LockHandle) -> None:
        await self._run_quick(admin.release_lock, handle.key, handle.token, writes=True)

    # -- idempotency records ----------------------------------------------------

    async def claim_idempotency(
        self, tenant: str, key: str, fingerprint: str, *, session_id: str, lease_s: float
    ) -> IdempotencyRecord | None:
        return await self._run_quick(
            admin.claim_idempotency, tenant, key, fingerprint, session_id, lease_s, writes=True
        )

    async def finish_idempotency(
        self, tenant: str, key: str, *, status: int, response: str, ttl_s: float
    ) -> None:
        await self._run_quick(admin.finish_idempotency, tenant, key, status, response, ttl_s, writes=True)

    async def release_idempotency(self, tenant: str, key: str) -> None:
        await self._run_quick(admin.release_idempotency, tenant, key, writes=True)
