"""The PostgreSQL store (asyncpg): sessions shared by any number of workers and hosts.

Appends lock the session row (``SELECT … FOR UPDATE``) and insert the whole
batch in one transaction, so concurrent writers queue instead of interleaving.
A load is one statement (one snapshot, one round trip) and touches only the
session row, the tail by primary key and the emotion index. Round trips are a large
share of a worker's CPU per turn (each is a socket write and a wake-up), so a turn's
writes take as few statements as their checks allow, a released connection goes
back to the pool without a reset query, and a task's calls in a row can share one pooled
connection (`one_connection`, taken at the first statement; `let_go` hands it back early):
a turn's lock, load, recall and user turn take one acquisition. Job locks are a
table with a database-clock expiry and a sequence for fencing tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

from ...errors import (
    ConfigError,
    ConflictError,
    LockNotAcquired,
    MissingExtra,
    StoreError,
    translate,
)
from ...types import Constraint, NewTurn, SessionState, Summary, Turn, utc_now
from .._codec import (
    being_cancelled,
    check_owner,
    constraints_from_json,
    constraints_to_json,
    last_answer,
)
from .._codec import metadata_json as _meta
from .._driver_errors import asyncpg_errors
from ..base import (
    ClosesOnExit,
    IdempotencyRecord,
    JobOutcome,
    JobStats,
    LockHandle,
    SessionInfo,
    SessionVersion,
)
from ..lifecycle import SQL_SESSION_TABLES
from ..postings import AppendInput, IndexHead, IndexStats, KeptHeads, completes_block
from ..records import TurnTrace
from ..trace_pack import TEXT_TURN_SLACK, TraceReading, pack_trace_soon, read_trace
from ..usage import postgres_session_bytes
from . import postings as pg_postings
from .lifecycle import PostgresLifecycle, erase
from .rows import turn as turn_row
from .schema import KEY_MOMENT_FLOOR, migrate

__all__ = ["PostgresDriver"]

_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_W = "WHERE tenant = $1 AND session_id = $2"
# The emotion is a scalar subquery, not a join: it forces one primary-key probe per
# returned turn whatever the planner's statistics say (a fresh bulk load has none).
_TURN_COLUMNS = (
    "SELECT t.seq, t.role, t.content, t.tokens, t.created_at, t.metadata::text AS metadata,"
    " (SELECT e.emotion FROM turn_emotions e WHERE e.tenant = t.tenant"
    " AND e.session_id = t.session_id AND e.seq = t.seq) AS emotion"
)
_HEAD = f"SELECT last_seq, user_id FROM sessions {_W} FOR UPDATE"
# Turns at scattered seqs (a recall hit list): one primary-key probe per wanted seq.
_TURNS_BY_SEQS = (
    f"{_TURN_COLUMNS} FROM unnest($3::bigint[]) AS q(seq) CROSS JOIN LATERAL"
    " (SELECT * FROM turns x WHERE x.tenant = $1 AND x.session_id = $2 AND x.seq = q.seq"
    " LIMIT 1) t"
    " ORDER BY t.seq"
)
_TURN_SELECT = f"{_TURN_COLUMNS} FROM turns t WHERE t.tenant = $1 AND t.session_id = $2"
# The row of one turn inside `load`'s single statement: an anonymous record (a tuple to the
# driver), in the order `_turn` reads.
_TURN_ROW = (
    "ROW(t.seq, t.role, t.content, t.tokens, t.created_at, t.metadata::text,"
    " (SELECT e.emotion FROM turn_emotions e WHERE e.tenant = t.tenant"
    " AND e.session_id = t.session_id AND e.seq = t.seq))"
)
# `load` in one statement (one snapshot, so no transaction and one round trip): the session
# row, its first verbatim seq (`window_start` in SQL), the tail and, with ``$5`` > 0, the key
# moments: the strongest seqs before the tail, then one primary-key probe per seq (``LIMIT 1``
# keeps the planner from flattening the lateral into a scan of the session). ``{floor}`` is a
# literal so the planner can prove the partial index on emotions applies.
_LOAD = (
    "WITH s AS (SELECT last_seq, created_at, updated_at, last_answer, summary_text,"
    " summary_covers_seq, summary_tokens, summary_version, summary_created_at,"
    " constraints::text AS constraints, constraints_version,"
    " GREATEST(1, last_seq - LEAST(GREATEST(last_seq - summary_covers_seq, $3::bigint),"
    " GREATEST($4::bigint, 0)) + 1) AS first"
    f" FROM sessions {_W})"
    f" SELECT s.*, ARRAY(SELECT {_TURN_ROW} FROM turns t WHERE t.tenant = $1 AND t.session_id = $2"
    " AND t.seq >= s.first ORDER BY t.seq) AS tail,"
    f" ARRAY(SELECT {_TURN_ROW} FROM (SELECT seq FROM turn_emotions {_W} {{floor}}"
    " AND emotion >= $6 AND seq < s.first AND $5::int > 0"
    " ORDER BY emotion DESC, seq DESC LIMIT $5) AS q CROSS JOIN LATERAL"
    " (SELECT * FROM turns x WHERE x.tenant = $1 AND x.session_id = $2 AND x.seq = q.seq"
    " LIMIT 1) t ORDER BY t.seq) AS moments,"
    " r.indexed_seq AS ix_seq, r.docs AS ix_docs, r.total_len AS ix_len, r.layout AS ix_layout"
    " FROM s LEFT JOIN recall_index r ON r.tenant = $1 AND r.session_id = $2"
)
"""A session's state and, in the same snapshot, its recall index statistics (`index_stats`
answers from them when it is the next call: one statement fewer per turn)."""


# `put_trace` in one statement (atomic without a transaction): the write, then what the count
# (``$6``, 0 = none) and the age (``$7``, NULL = none) drop, as if done in that order. The
# newest turn is ``top``; turns up to ``cut`` = ``top - keep`` go; of the 8 lowest turns left
# (a bounded look keeps each write O(1)) those older than ``$7`` go. The new trace (when the
# session exists) takes part as written; it is not written if it would be dropped at once, and
# its old version then goes too, so no row is both deleted and upserted in the statement.
# The texts the trace refers to (keys ``$8``, packed ``$9``) are kept once (``last_turn``
# moved up when ``$10`` = TEXT_TURN_SLACK behind); those whose ``last_turn`` lags the oldest
# trace left by more go, except the ones this trace names.
_PUT_TRACE = (
    f"WITH c AS (SELECT x.ins, GREATEST((SELECT MAX(turn) FROM turn_traces {_W}),"
    " CASE WHEN x.ins THEN $3::int END) AS top"
    f" FROM (SELECT EXISTS (SELECT 1 FROM sessions {_W}) AS ins) x),"
    " k AS (SELECT ins, CASE WHEN $6::int <> 0 THEN top - $6::int END AS cut FROM c),"
    " f AS (SELECT q.turn, q.created_at FROM ((SELECT t.turn, t.created_at FROM turn_traces t, k"
    " WHERE t.tenant = $1 AND t.session_id = $2 AND (k.cut IS NULL OR t.turn > k.cut)"
    " AND NOT (k.ins AND t.turn = $3) ORDER BY t.turn LIMIT 8)"
    " UNION ALL SELECT $3, $4 FROM k WHERE k.ins AND (k.cut IS NULL OR $3 > k.cut)) q"
    " ORDER BY q.turn LIMIT 8),"
    " doomed AS (SELECT turn FROM f WHERE $7::timestamptz IS NOT NULL AND created_at < $7::timestamptz),"
    " d AS (DELETE FROM turn_traces t USING k WHERE t.tenant = $1 AND t.session_id = $2"
    " AND ((k.cut IS NOT NULL AND t.turn <= k.cut) OR t.turn IN (SELECT turn FROM doomed))),"
    " tx AS (INSERT INTO trace_texts AS x (tenant, session_id, key, last_turn, body)"
    " SELECT $1, $2, u.key, $3, u.body FROM k, unnest($8::text[], $9::bytea[]) AS u(key, body) WHERE k.ins"
    " ON CONFLICT (tenant, session_id, key) DO UPDATE SET last_turn = excluded.last_turn"
    " WHERE x.last_turn <= excluded.last_turn - $10::int),"
    " dt AS (DELETE FROM trace_texts x WHERE x.tenant = $1 AND x.session_id = $2 AND NOT (x.key = ANY($8::text[]))"
    " AND x.last_turn < COALESCE((SELECT MIN(turn) FROM f WHERE turn NOT IN (SELECT turn FROM doomed)),"
    " 2147483647) - $10::int)"
    " INSERT INTO turn_traces (tenant, session_id, turn, created_at, body, packed)"
    " SELECT $1, $2, $3, $4, NULL, $5 FROM k WHERE k.ins AND (k.cut IS NULL OR $3 > k.cut)"
    " AND $3 NOT IN (SELECT turn FROM doomed)"
    " ON CONFLICT (tenant, session_id, turn)"
    " DO UPDATE SET created_at = excluded.created_at, body = NULL, packed = excluded.packed"
)


def _check_head(head: Any, expected_last_seq: int | None, user_id: str | None, session_id: str) -> None:
    """Raise `ConflictError` when the session is not at ``expected_last_seq``, or `InputError`
    when it belongs to another user than ``user_id`` (``head``: its row, or ``None``)."""
    last = head["last_seq"] if head else 0
    if expected_last_seq is not None and expected_last_seq != last:
        raise ConflictError(f"session {session_id!r} is at seq {last}, expected {expected_last_seq}")
    check_owner(head["user_id"] if head else None, user_id, session_id)


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


# An append's first statement: lock the session row, check the compare-and-set and the owner,
# and write the turns (numbered after the locked ``last_seq``), their emotions and the session's
# head (last seq, last answer, owner if it had none). Nothing is written unless the checks pass;
# the row returned (none: no session yet) tells why. ``$3``/``$9`` are 1-based offsets
# after the head, ``$13`` the offset of the batch's last answer (0: none).
_APPEND_AT = (
    f"WITH h AS (SELECT last_seq, user_id FROM sessions {_W} FOR UPDATE),"
    " ix AS (SELECT r.indexed_seq FROM recall_index r"
    " WHERE r.tenant = $1 AND r.session_id = $2 AND $18::bigint IS NOT NULL),"
    " ok AS (SELECT last_seq FROM h WHERE ($15::bigint IS NULL OR last_seq = $15::bigint)"
    " AND ($16::text IS NULL OR user_id IS NULL OR user_id = $16::text){only}),"
    " w AS (INSERT INTO turns (tenant, session_id, seq, role, content, tokens, created_at, metadata)"
    " SELECT $1, $2, ok.last_seq + u.s, u.r, u.c, u.k, u.a, u.m::jsonb FROM ok, unnest("
    "$3::bigint[], $4::text[], $5::text[], $6::int[], $7::timestamptz[], $8::text[]"
    ") AS u(s, r, c, k, a, m)),"
    " e AS (INSERT INTO turn_emotions (tenant, session_id, seq, emotion)"
    " SELECT $1, $2, ok.last_seq + u.s, u.e FROM ok, unnest($9::bigint[], $10::float8[]) AS u(s, e)),"
    " s AS (UPDATE sessions SET last_seq = ok.last_seq + $11, updated_at = $12,"
    " last_answer = CASE WHEN $13::bigint > 0 THEN $14 ELSE sessions.last_answer END,"
    " last_answer_seq = GREATEST(sessions.last_answer_seq,"
    " CASE WHEN $13::bigint > 0 THEN ok.last_seq + $13::bigint ELSE 0 END),"
    " emotions_version = sessions.emotions_version + $17,"
    " user_id = COALESCE(sessions.user_id, $16::text)"
    " FROM ok WHERE sessions.tenant = $1 AND sessions.session_id = $2),"
    # The recall index (`_pg_postings.append_args`): postings computed for an assumed head
    # (``$18`` = its last seq, ``$19``–``$21`` the turn there), written if the session is at
    # it, its index current and that turn unchanged; otherwise the index state, the turn
    # before the batch and the last seq as of the statement's snapshot (``seen_seq``: the lock
    # may have waited for a write the snapshot does not show) come back for
    # `_pg_postings.index_turns` (``$18`` NULL: none of it).
    " go AS (SELECT 1 FROM ok WHERE {at_head}),"
    " p AS (INSERT INTO recall_recent (tenant, session_id, block, term, data)"
    " SELECT $1, $2, u.b, u.t, u.d FROM go, unnest($22::text[], $23::int[], $24::bytea[]) AS u(t, b, d)"
    " ON CONFLICT (tenant, session_id, block, term)"
    " DO UPDATE SET data = recall_recent.data || excluded.data),"
    " r AS (INSERT INTO recall_index (tenant, session_id, indexed_seq, docs, total_len, layout)"
    " SELECT $1, $2, $25::bigint, $26::bigint, $27::float8, $28::int FROM go"
    " ON CONFLICT (tenant, session_id) DO UPDATE SET indexed_seq = excluded.indexed_seq,"
    " docs = recall_index.docs + excluded.docs, total_len = recall_index.total_len + excluded.total_len)"
    " SELECT last_seq, user_id, EXISTS (SELECT 1 FROM ok) AS written,"
    " EXISTS (SELECT 1 FROM go) AS indexed, (SELECT indexed_seq FROM ix) AS indexed_seq,"
    " (SELECT x.last_seq FROM sessions x WHERE x.tenant = $1 AND x.session_id = $2"
    " AND $18::bigint IS NOT NULL) AS seen_seq,"
    " (SELECT ROW(t.role, t.content, t.metadata::text) FROM turns t WHERE $18::bigint IS NOT NULL"
    " AND NOT EXISTS (SELECT 1 FROM go) AND t.tenant = $1 AND t.session_id = $2"
    " AND t.seq = h.last_seq) AS previous FROM h"
)

# The recall index's head is where `append_args` assumed it (``$18``): the session is at that
# seq, its index is current, and the turn there is the one assumed.
_AT_HEAD = (
    "{seq} = $18::bigint AND COALESCE((SELECT indexed_seq FROM ix), CASE WHEN {seq} = 0 THEN 0::bigint END)"
    " = {seq} AND ($18::bigint = 0 OR EXISTS (SELECT 1 FROM turns p WHERE p.tenant = $1"
    " AND p.session_id = $2 AND p.seq = $18::bigint AND p.role = $19::text"
    " AND p.content = $20::text AND p.metadata = $21::jsonb))"
)
_APPEND = _APPEND_AT.format(only="", at_head=_AT_HEAD.format(seq="ok.last_seq"))
# The same statement writing nothing unless the head is as assumed: then it writes the turns
# and their postings together, atomic on its own (no transaction: `PostgresDriver.append`).
_APPEND_AT_HEAD = _APPEND_AT.format(
    only=" AND " + _AT_HEAD.format(seq="last_seq"), at_head=_AT_HEAD.format(seq="ok.last_seq"))


async def _write_turns(
    db: pg_postings.Conn, key: tuple[str, str], turns: Sequence[NewTurn], now: datetime,
    user_id: str | None, expected_last_seq: int | None, index: Sequence[Any], statement: str = _APPEND,
) -> Any:
    """`_APPEND` (or ``statement``, `_APPEND_AT_HEAD`) for ``turns`` in one statement (``index``:
    `_pg_postings.append_args`): the session's row (``last_seq`` as it was before,
    ``user_id``, ``written``, and the index's columns), or ``None`` if it has none."""
    offsets = list(range(1, len(turns) + 1))
    scored = [(i, float(t.emotion)) for i, t in zip(offsets, turns, strict=True) if t.emotion is not None]
    answer_at = max((i for i, t in zip(offsets, turns, strict=True) if t.role == "assistant"), default=0)
    return await db.fetchrow(
        statement,
        *key, offsets, [t.role for t in turns], [t.content for t in turns],
        [t.tokens for t in turns], [_aware(t.created_at) for t in turns],
        [_meta(t.metadata) for t in turns],
        [i for i, _ in scored], [e for _, e in scored],
        len(turns), now, answer_at, last_answer(turns), expected_last_seq, user_id, int(bool(scored)),
        *index,
    )


def _at_known_head(index: Sequence[Any], count: int) -> bool:
    """True when `_APPEND_AT_HEAD` can do an append alone: its postings were computed for a
    known head of a stored session (``index[0]``, -1: none) and it seals no block (a seal is
    a second statement, in the transaction of the full append)."""
    head = int(index[0]) if index and index[0] is not None else -1
    return head > 0 and not completes_block(head + 1, head + count)


def _numbered(last: int, turns: Sequence[NewTurn]) -> list[Turn]:
    """``turns`` as stored after seq ``last``."""
    return [
        Turn(seq=last + i, role=t.role, content=t.content, tokens=t.tokens,
             created_at=_aware(t.created_at),
             emotion=None if t.emotion is None else float(t.emotion),
             metadata=dict(t.metadata))
        for i, t in enumerate(turns, start=1)
    ]


class _Scope:
    """One task's `PostgresDriver.one_connection`: the connection it holds now, if any."""

    __slots__ = ("db", "task")

    def __init__(self, task: asyncio.Task[Any] | None) -> None:
        self.task = task
        self.db: Any = None


async def _keep_session(db: Any) -> None:
    """The pool's reset of a released connection: nothing beyond asyncpg's own rollback of an
    open transaction. asyncpg's default also runs ``pg_advisory_unlock_all(); CLOSE ALL;
    UNLISTEN *; RESET ALL`` (one round trip per release, a third of a turn's statements);
    this store leaves nothing for it to undo: advisory locks and ``SET`` are transaction-scoped
    (``pg_advisory_xact_lock``, ``SET LOCAL``), and it opens no cursor and listens to nothing."""


class PostgresDriver(PostgresLifecycle, ClosesOnExit):
    """A `Store` in PostgreSQL; ``schema`` names the schema holding its tables."""

    def __init__(
        self, dsn: str, *, schema: str = "contextmode", min_size: int = 1, max_size: int = 10
    ) -> None:
        if not _SCHEMA_RE.match(schema):
            raise ConfigError(f"invalid schema name {schema!r}: use [a-z_][a-z0-9_]*")
        self.dsn = dsn
        self.schema = schema
        self._min_size, self._max_size = min_size, max_size
        self._pool: Any = None
        self._opening = asyncio.Lock()
        self._heads = KeptHeads()
        """What the next append of a session needs (its postings are written with its turns)."""
        self._scope: ContextVar[_Scope | None] = ContextVar("contextmode_pg_scope", default=None)
        """The `one_connection` scope of the running task (a task started inside one sees it,
        but as another task's: it takes its own connections)."""
        self._released: set[tuple[str, int]] = set()
        """Job locks `record_jobs` released; their context's exit has nothing left to do."""
        self._loaded_stats: tuple[asyncio.Task[Any], tuple[str, str], IndexStats] | None = None
        """The index statistics the last `load` read with the state (its task, its session):
        `index_stats` answers from them when it is that task's next call and nobody's
        statement ran in between (every statement clears them, `_db`)."""

    # -- plumbing ---------------------------------------------------------------

    async def _open_pool(self) -> Any:
        try:
            import asyncpg
        except ImportError as exc:
            raise MissingExtra("postgres", "asyncpg") from exc
        async with self._opening:
            if self._pool is None:
                pool = await asyncpg.create_pool(
                    self.dsn,
                    min_size=self._min_size,
                    max_size=self._max_size,
                    server_settings={"search_path": self.schema},
                    reset=_keep_session,
                )
                async with pool.acquire() as db:
                    await migrate(db, self.schema)
                self._pool = pool
        return self._pool

    @asynccontextmanager
    async def _db(self) -> AsyncIterator[Any]:
        """A pooled connection (inside `one_connection`, the scope's: taken at its first
        statement); the one place asyncpg and socket errors become StoreError."""
        self._loaded_stats = None  # a statement in between: `index_stats` reads them again
        try:
            scope = self._scope.get()
            if scope is not None and scope.task is asyncio.current_task():
                db = scope.db if scope.db is not None else await self._take(scope)
                try:
                    yield db
                except BaseException:
                    # A failed or cancelled statement: its connection goes back to the pool
                    # (which resets or drops it, as for an unscoped call); the next one in
                    # the scope takes a fresh connection.
                    with contextlib.suppress(Exception):  # the statement's own error is the one to raise
                        await self._give_back(scope)
                    raise
                return
            pool = self._pool or await self._open_pool()
            async with pool.acquire() as db:
                yield db
        except (ConflictError, LockNotAcquired, MissingExtra):
            raise
        except Exception as exc:
            if being_cancelled():
                # A cancel interrupted the call and the driver's cleanup failed on the dead
                # connection: stay cancelled rather than turn the cancel into a StoreError.
                raise asyncio.CancelledError() from exc
            if (error := translate(exc, asyncpg_errors(), f"PostgreSQL store failed: {exc}")) is not None:
                raise error from exc
            raise

    async def _take(self, scope: _Scope) -> Any:
        pool = self._pool or await self._open_pool()
        scope.db = await pool.acquire()
        return scope.db

    async def _give_back(self, scope: _Scope) -> None:
        db, scope.db = scope.db, None
        if db is not None and self._pool is not None:
            await self._pool.release(db)

    @asynccontextmanager
    async def one_connection(self) -> AsyncIterator[None]:
        """This task's calls share one pooled connection until the context ends (`SharesConnection`):
        taken at the first statement, not on entry, and handed back early by `let_go`.

        Only the task that entered the context uses it: tasks it starts take their own. Inside
        a scope of the same task this is that scope."""
        held = self._scope.get()
        if held is not None and held.task is asyncio.current_task():
            yield
            return
        scope = _Scope(asyncio.current_task())
        token = self._scope.set(scope)
        try:
            yield
        finally:
            self._scope.reset(token)
            await self._give_back(scope)

    async def let_go(self) -> None:
        """Hand the connection this task's `one_connection` scope holds back to the pool; the
        scope's next statement takes a fresh one (no scope, or nothing held: nothing)."""
        scope = self._scope.get()
        if scope is not None and scope.task is asyncio.current_task() and scope.db is not None:
            await self._give_back(scope)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    # -- turn log ---------------------------------------------------------------

    async def append(self, given: AppendInput, *, expected_last_seq: int | None = None) -> list[Turn]:
        key, user_id, turns, analyzed = given.key, given.user_id, given.turns, given.analyzed
        session_id = key[1]
        now = utc_now()
        # The postings are computed for the head this process's last append left (if any) and
        # written by the append's own statement; `index_turns` redoes them if it was stale.
        index = pg_postings.append_args(self._heads.take(key), turns, analyzed) if turns else []
        if _at_known_head(index, len(turns)):
            # The usual append: one statement, without BEGIN and COMMIT around it. It writes
            # only if the session is at the head assumed, and then does all the work below.
            async with self._db() as db:
                row = await _write_turns(db, key, turns, now, user_id, expected_last_seq, index, _APPEND_AT_HEAD)
            if row is not None and row["written"]:
                self._heads.keep(key, row["last_seq"], turns, indexed=True)
                return _numbered(row["last_seq"], turns)
            # Nothing was written (another head, a failed check): the full append below.
        async with self._db() as db, db.transaction():
            if not turns:
                head = await db.fetchrow(_HEAD, *key)
                _check_head(head, expected_last_seq, user_id, session_id)
                return []
            row = await _write_turns(db, key, turns, now, user_id, expected_last_seq, index)
            if row is None:  # a new session: created here (or by a concurrent first append)
                await db.execute(
                    "INSERT INTO sessions (tenant, session_id, created_at, updated_at, user_id)"
                    " VALUES ($1, $2, $3, $3, $4) ON CONFLICT DO NOTHING",
                    *key, now, user_id,
                )
                if index[0] is not None:
                    index = pg_postings.append_args(IndexHead(0, None, None), turns, analyzed)
                row = await _write_turns(db, key, turns, now, user_id, expected_last_seq, index)
            if row is None or not row["written"]:
                _check_head(row, expected_last_seq, user_id, session_id)
                raise StoreError(f"session {session_id!r} was erased while being appended to")
            numbered = _numbered(row["last_seq"], turns)
            indexed = await pg_postings.index_turns(db, key, numbered, row, analyzed)  # same transaction
        self._heads.keep(key, row["last_seq"], turns, indexed=indexed)
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
        floor = f"AND emotion >= {KEY_MOMENT_FLOOR}" if key_moment_threshold >= KEY_MOMENT_FLOOR else ""
        async with self._db() as db:
            row = await db.fetchrow(
                _LOAD.format(floor=floor), *key, recent, max_uncovered, max(key_moments, 0),
                float(key_moment_threshold),
            )
        if row is None:
            return SessionState(tenant=tenant, session_id=session_id)
        task = asyncio.current_task()
        if task is not None:
            stats = IndexStats() if row["ix_seq"] is None else IndexStats(
                indexed_seq=row["ix_seq"], docs=row["ix_docs"], total_len=row["ix_len"], exists=True,
                layout=row["ix_layout"])
            self._loaded_stats = (task, key, stats)
        summary = None
        if row["summary_version"]:
            summary = Summary(
                text=row["summary_text"], covers_seq=row["summary_covers_seq"],
                tokens=row["summary_tokens"], version=row["summary_version"],
                created_at=row["summary_created_at"],
            )
        return SessionState(
            tenant=tenant,
            session_id=session_id,
            last_seq=row["last_seq"],
            turns=tuple(turn_row(r) for r in row["tail"]),
            summary=summary,
            constraints=constraints_from_json(row["constraints"]),
            constraints_version=row["constraints_version"],
            key_moments=tuple(turn_row(r) for r in row["moments"]),
            last_answer=row["last_answer"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
        )

    async def turns(
        self, tenant: str, session_id: str, *, from_seq: int = 1, to_seq: int | None = None
    ) -> list[Turn]:
        key = (tenant, session_id)
        upper = to_seq if to_seq is not None else 2**62
        async with self._db() as db:
            rows = await db.fetch(
                f"{_TURN_SELECT} AND t.seq >= $3 AND t.seq <= $4 ORDER BY t.seq",
                *key, from_seq, upper,
            )
        return [turn_row(r) for r in rows]

    async def turns_at(self, tenant: str, session_id: str, seqs: Sequence[int]) -> list[Turn]:
        key = (tenant, session_id)
        wanted = sorted({int(s) for s in seqs})
        if not wanted:
            return []
        async with self._db() as db:
            rows = await db.fetch(_TURNS_BY_SEQS, *key, wanted)
        return [turn_row(r) for r in rows]

    async def version(self, tenant: str, session_id: str) -> SessionVersion:
        key = (tenant, session_id)
        async with self._db() as db:
            row = await db.fetchrow(
                "SELECT last_seq, summary_version, constraints_version, emotions_version,"
                f" created_at FROM sessions {_W}",
                *key,
            )
        return SessionVersion(**dict(row)) if row else SessionVersion()

    # -- derived records --------------------------------------------------------

    async def commit_summary(
        self, tenant: str, session_id: str, summary: Summary, *, expected_version: int
    ) -> bool:
        key = (tenant, session_id)
        async with self._db() as db:
            status = await db.execute(
                "UPDATE sessions SET summary_text = $3, summary_covers_seq = $4,"
                " summary_tokens = $5, summary_created_at = $6,"
                f" summary_version = summary_version + 1 {_W} AND summary_version = $7"
                " AND summary_covers_seq < $4 AND last_seq >= $4",
                *key, summary.text, summary.covers_seq, summary.tokens,
                _aware(summary.created_at), expected_version,
            )
        return bool(status == "UPDATE 1")

    async def commit_constraints(
        self,
        tenant: str,
        session_id: str,
        constraints: Sequence[Constraint],
        *,
        expected_version: int,
    ) -> bool:
        key = (tenant, session_id)
        async with self._db() as db:
            status = await db.execute(
                "UPDATE sessions SET constraints = $3::jsonb,"
                f" constraints_version = constraints_version + 1 {_W}"
                " AND constraints_version = $4",
                *key, constraints_to_json(constraints), expected_version,
            )
        return bool(status == "UPDATE 1")

    async def set_emotions(self, tenant: str, session_id: str, scores: Mapping[int, float]) -> None:
        key = (tenant, session_id)
        items = [(int(s), float(e)) for s, e in scores.items()]
        if not items:
            return
        # One statement: lock the session row, upsert the scores of stored turns, and bump the
        # emotions version only when a score changed.
        async with self._db() as db:
            await db.execute(
                f"WITH h AS (SELECT last_seq FROM sessions {_W} FOR UPDATE),"
                " c AS (INSERT INTO turn_emotions (tenant, session_id, seq, emotion)"
                " SELECT $1, $2, u.s, u.e FROM unnest($3::bigint[], $4::float8[]) AS u(s, e), h"
                " WHERE u.s >= 1 AND u.s <= h.last_seq"
                " ON CONFLICT (tenant, session_id, seq) DO UPDATE SET emotion = EXCLUDED.emotion"
                " WHERE turn_emotions.emotion IS DISTINCT FROM EXCLUDED.emotion RETURNING 1)"
                f" UPDATE sessions SET emotions_version = emotions_version + 1 {_W}"
                " AND EXISTS (SELECT 1 FROM c)",
                *key, [s for s, _ in items], [e for _, e in items],
            )

    async def record_job(
        self, tenant: str, session_id: str, job: str, *, ok: bool, error: str | None = None,
        rejected: bool = False,
    ) -> None:
        await self.record_jobs(
            tenant, session_id, [JobOutcome(job=job, ok=ok, error=error, rejected=rejected, finished_at=utc_now())]
        )

    async def record_jobs(
        self, tenant: str, session_id: str, outcomes: Sequence[JobOutcome], *, release: LockHandle | None = None
    ) -> None:
        key = (tenant, session_id)
        # One row per job name (a statement may change a row only once): counts summed, the
        # last outcome's error and time, as the outcomes one after the other would leave them.
        rows: dict[str, list[Any]] = {}
        for o in outcomes:
            row = rows.setdefault(o.job, [0, 0, 0, None, None])
            row[0] += int(o.ok)
            row[1] += int(not o.ok and not o.rejected)
            row[2] += int(not o.ok and o.rejected)
            row[3], row[4] = (None if o.ok else o.error), _aware(o.finished_at)
        if not rows and release is None:
            return
        async with self._db() as db:
            await db.execute(
                "WITH r AS (DELETE FROM job_locks WHERE key = $9 AND token = $10)"
                " INSERT INTO jobs (tenant, session_id, job, ok, failed, rejected, last_error, last_run)"
                " SELECT $1, $2, u.j, u.o, u.f, u.r, u.e, u.t FROM unnest($3::text[], $4::int[], $5::int[],"
                " $6::int[], $7::text[], $8::timestamptz[]) AS u(j, o, f, r, e, t)"
                " WHERE EXISTS (SELECT 1 FROM sessions WHERE tenant = $1 AND session_id = $2)"
                " ON CONFLICT (tenant, session_id, job) DO UPDATE SET ok = jobs.ok + EXCLUDED.ok,"
                " failed = jobs.failed + EXCLUDED.failed, rejected = jobs.rejected + EXCLUDED.rejected,"
                " last_error = EXCLUDED.last_error, last_run = EXCLUDED.last_run",
                *key, list(rows), *([r[i] for r in rows.values()] for i in range(5)),
                release.key if release is not None else None, release.token if release is not None else None,
            )
        if release is not None:
            self._released.add((release.key, release.token))  # leaving the lock's context writes nothing

    # -- administration ---------------------------------------------------------

    _INFO = (
        "SELECT session_id, last_seq, created_at, updated_at, summary_covers_seq,"
        " summary_version, constraints_version, user_id FROM sessions"
    )

    async def _infos(self, db: Any, tenant: str, rows: list[Any]) -> list[SessionInfo]:
        jobs: dict[str, dict[str, JobStats]] = {}
        for r in await db.fetch(
            "SELECT session_id, job, ok, failed, rejected, last_error, last_run FROM jobs"
            " WHERE tenant = $1 AND session_id = ANY($2::text[])",
            tenant, [r["session_id"] for r in rows],
        ):
            jobs.setdefault(r["session_id"], {})[r["job"]] = JobStats(
                ok=r["ok"], failed=r["failed"], rejected=r["rejected"], last_error=r["last_error"],
                last_run=r["last_run"],
            )
        return [
            SessionInfo(tenant=tenant, jobs=jobs.get(r["session_id"], {}), **dict(r))
            for r in rows
        ]

    async def info(self, tenant: str, session_id: str) -> SessionInfo | None:
        key = (tenant, session_id)
        async with self._db() as db, db.transaction(isolation="repeatable_read", readonly=True):
            rows = await db.fetch(f"{self._INFO} {_W}", *key)
            infos = await self._infos(db, tenant, rows)
        return infos[0] if infos else None

    async def list_sessions(
        self, tenant: str, *, limit: int = 100, offset: int = 0, user_id: str | None = None
    ) -> list[SessionInfo]:
        async with self._db() as db, db.transaction(isolation="repeatable_read", readonly=True):
            rows = await db.fetch(
                f"{self._INFO} WHERE tenant = $1 AND ($4::text IS NULL OR user_id = $4)"
                " ORDER BY updated_at DESC, session_id LIMIT $2 OFFSET $3",
                tenant, limit, offset, user_id,
            )
            return await self._infos(db, tenant, rows)

    async def delete(self, tenant: str, session_id: str) -> bool:
        key = (tenant, session_id)
        self._heads.forget(key)
        async with self._db() as db, db.transaction():
            counts = await erase(db, key, None)
        return counts["sessions"] == 1

    async def purge_idle(self, older_than: datetime) -> int:
        async with self._db() as db, db.transaction():
            gone = await db.fetch(
                "DELETE FROM sessions WHERE updated_at < $1 RETURNING tenant, session_id",
                _aware(older_than),
            )
            await db.execute("DELETE FROM job_locks WHERE expires_at < clock_timestamp()")
            tenants = [r["tenant"] for r in gone]
            sids = [r["session_id"] for r in gone]
            for key in zip(tenants, sids, strict=True):
                self._heads.forget(key)
            for table in (kind.table for kind in SQL_SESSION_TABLES):
                await db.execute(
                    f"DELETE FROM {table} x USING unnest($1::text[], $2::text[]) AS g(t, s)"
                    " WHERE x.tenant = g.t AND x.session_id = g.s",
                    tenants, sids,
                )
        return len(gone)

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
        key = (tenant, session_id)
        packed = await pack_trace_soon(trace)
        async with self._db() as db:
            await db.execute(
                _PUT_TRACE, *key, trace.turn, _aware(trace.created_at), packed.body, keep,
                None if older_than is None else _aware(older_than),
                list(packed.texts), list(packed.texts.values()), TEXT_TURN_SLACK,
            )

    async def get_trace(self, tenant: str, session_id: str, turn: int) -> TurnTrace | None:
        key = (tenant, session_id)
        async with self._db() as db:
            row = await db.fetchrow(f"SELECT body, packed FROM turn_traces {_W} AND turn = $3", *key, turn)
            if row is None:
                return None
            reading = read_trace(row["packed"] if row["packed"] is not None else row["body"])
            if not isinstance(reading, TraceReading):
                return reading
            turns = await db.fetch(f"SELECT seq, content FROM turns {_W} AND seq = ANY($3::bigint[])",
                                   *key, sorted(reading.seqs)) if reading.seqs else []
            texts = await db.fetch(f"SELECT key, body FROM trace_texts {_W} AND key = ANY($3::text[])",
                                   *key, sorted(reading.keys)) if reading.keys else []
        return reading.rebuild({r["seq"]: r["content"] for r in turns}, {r["key"]: r["body"] for r in texts})

    async def delete_traces(self, tenant: str, session_id: str) -> int:
        key = (tenant, session_id)
        async with self._db() as db:
            status = await db.execute(
                f"WITH x AS (DELETE FROM trace_texts {_W}) DELETE FROM turn_traces {_W}", *key)
        return int(status.split()[-1])

    async def session_bytes(self, tenant: str, session_id: str) -> dict[str, int]:
        """Bytes the session keeps by kind of record (`store.usage`)."""
        key = (tenant, session_id)
        async with self._db() as db:
            return await postgres_session_bytes(db, key)

    # -- job locks --------------------------------------------------------------

    # -- recall index (store/postings.py) ----------------------------------------

    async def index_stats(self, tenant: str, session_id: str) -> IndexStats:
        key = (tenant, session_id)
        loaded, self._loaded_stats = self._loaded_stats, None
        if loaded is not None and loaded[0] is asyncio.current_task() and loaded[1] == key:
            return loaded[2]  # read with the state just loaded, nothing run since (a turn's recall)
        async with self._db() as db:
            return await pg_postings.stats(db, key)

    async def postings(
        self, tenant: str, session_id: str, terms: Sequence[str], *, from_block: int = 0
    ) -> dict[str, list[tuple[int, bytes]]]:
        key = (tenant, session_id)
        async with self._db() as db:
            return await pg_postings.postings(db, key, list(terms), from_block)

    async def term_counts(self, tenant: str, session_id: str, terms: Sequence[str]) -> dict[str, int]:
        key = (tenant, session_id)
        async with self._db() as db:
            return await pg_postings.term_counts(db, key, list(terms))

    async def query_postings(
        self, tenant: str, session_id: str, terms: Mapping[str, int], *,
        capped: Mapping[str, int], cap: int, most: int,
    ) -> tuple[dict[str, list[tuple[int, bytes]]], dict[str, int]]:
        key = (tenant, session_id)
        async with self._db() as db:
            return await pg_postings.query_postings(db, key, terms, capped, (cap, most))

    async def index_backfill(self, tenant: str, session_id: str, *, batch: int = 2000) -> int:
        key = (tenant, session_id)
        async with self._db() as db, db.transaction():
            return await pg_postings.backfill(db, key, batch)

    async def sessions_to_index(self, *, limit: int = 1000) -> list[tuple[str, str, int, int]]:
        async with self._db() as db:
            return await pg_postings.lagging(db, limit)

    @asynccontextmanager
    async def hold(self, key: str, ttl_s: float) -> AsyncIterator[LockHandle]:
        """Hold lock ``key`` (`store.front.Driver.hold`)."""
        async with self._db() as db:
            # Takes a free or expired lock in one statement; the database clock decides.
            token = await db.fetchval(
                "INSERT INTO job_locks (key, token, expires_at)"
                " VALUES ($1, nextval('fence'), clock_timestamp() + make_interval(secs => $2))"
                " ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token,"
                " expires_at = EXCLUDED.expires_at"
                " WHERE job_locks.expires_at <= clock_timestamp() RETURNING token",
                key, float(ttl_s),
            )
        if token is None:
            raise LockNotAcquired(f"job lock {key!r} is held")
        try:
            yield LockHandle(key=key, token=token)
        finally:
            if (key, token) in self._released:
                self._released.discard((key, token))
            else:
                async with self._db() as db:
                    await db.execute("DELETE FROM job_locks WHERE key = $1 AND token = $2", key, token)

    async def release(self, handle: LockHandle) -> None:
        async with self._db() as db:
            await db.execute("DELETE FROM job_locks WHERE key = $1 AND token = $2", handle.key, handle.token)

    # -- idempotency records ----------------------------------------------------

    async def claim_idempotency(
        self, tenant: str, key: str, fingerprint: str, *, session_id: str, lease_s: float
    ) -> IdempotencyRecord | None:
        async with self._db() as db:
            for _ in range(3):  # a record read as live may lapse before the next statement
                taken = await db.fetchval(
                    "INSERT INTO idempotency (tenant, key, session_id, fingerprint, status, response,"
                    " expires_at) VALUES ($1, $2, $5, $3, 0, '', clock_timestamp() + make_interval(secs => $4))"
                    " ON CONFLICT (tenant, key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint,"
                    " session_id = EXCLUDED.session_id,"
                    " status = 0, response = '', expires_at = EXCLUDED.expires_at"
                    " WHERE idempotency.expires_at <= clock_timestamp() RETURNING 1",
                    tenant, key, fingerprint, float(lease_s), session_id,
                )
                if taken is not None:
                    return None
                row = await db.fetchrow(
                    "SELECT fingerprint, status, response FROM idempotency"
                    " WHERE tenant = $1 AND key = $2 AND expires_at > clock_timestamp()",
                    tenant, key,
                )
                if row is not None:
                    return IdempotencyRecord(
                        fingerprint=row["fingerprint"], status=row["status"], response=row["response"]
                    )
        raise StoreError(f"idempotency record {key!r} changed three times while being claimed")

    async def finish_idempotency(
        self, tenant: str, key: str, *, status: int, response: str, ttl_s: float
    ) -> None:
        async with self._db() as db:
            await db.execute(
                "UPDATE idempotency SET status = $3, response = $4,"
                " expires_at = clock_timestamp() + make_interval(secs => $5)"
                " WHERE tenant = $1 AND key = $2",
                tenant, key, status, response, float(ttl_s),
            )
            await db.execute("DELETE FROM idempotency WHERE expires_at <= clock_timestamp()")

    async def release_idempotency(self, tenant: str, key: str) -> None:
        async with self._db() as db:
            await db.execute("DELETE FROM idempotency WHERE tenant = $1 AND key = $2", tenant, key)
