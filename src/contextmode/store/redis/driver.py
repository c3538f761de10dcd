"""The Redis store (redis-py asyncio): sessions in Redis, every write one Lua script.

Appends, summary and constraint commits, emotion scores and deletes each run
as one script, so they are atomic and compare-and-set by construction. Loads
are one script too (a consistent snapshot) that reads the session hash, the
tail by sequence number and the emotion sorted set, never the whole log.
Job locks are ``SET NX PX`` with an ``INCR`` fencing token and a Lua release
that deletes only its own token. All keys start with ``namespace``.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

from ...errors import (
    ConfigError,
    ConflictError,
    LockNotAcquired,
    MissingExtra,
    StoreError,
    translate,
)
from ...types import Constraint, SessionState, Summary, Turn
from .._codec import (
    being_cancelled,
    constraints_from_json,
    constraints_to_json,
    from_micros,
    now_micros,
    owner_error,
    to_micros,
)
from .._driver_errors import redis_errors
from ..base import (
    ClosesOnExit,
    IdempotencyRecord,
    JobStats,
    LockHandle,
    OwnConnections,
    SessionInfo,
    SessionVersion,
)
from ..lifecycle import REDIS_SESSION_KEYS
from ..postings import AppendInput, KeptHeads
from ..records import TurnTrace
from ..trace_pack import TEXT_TURN_SLACK, TraceReading, pack_trace_soon, read_trace
from ..usage import redis_session_bytes
from . import scripts as lua
from .lifecycle import RedisLifecycle
from .postings import RedisPostings, index_rows
from .rows import decode_turn, encode_turn

__all__ = ["RedisDriver"]

_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9._:\-]{0,64}$")


async def _read_seqs(client: Any, k: dict[str, str], seqs: list[int]) -> list[Turn]:
    """The turns at ``seqs`` (ascending) that exist: one pipeline per 1,000 seqs."""
    out: list[Turn] = []
    for start in range(0, len(seqs), 1000):
        part = seqs[start : start + 1000]
        async with client.pipeline(transaction=False) as pipe:
            pipe.hmget(k["turns"], part)
            pipe.zmscore(k["emo"], [f"{s:012d}" for s in part])
            docs, scores = await pipe.execute()
        out += [decode_turn(s, d, c) for s, d, c in zip(part, docs, scores, strict=True) if d]
    return out


class RedisDriver(RedisLifecycle, RedisPostings, OwnConnections, ClosesOnExit):
    """A `Store` in Redis; ``namespace`` prefixes every key (default ``cm:``)."""

    def __init__(self, url: str, *, namespace: str = "cm:") -> None:
        if not _NAMESPACE_RE.match(namespace):
            raise ConfigError(f"invalid namespace {namespace!r}: use [A-Za-z0-9._:-], ≤ 64 chars")
        self.url = url
        self.namespace = namespace
        self._client: Any = None
        self._scripts: dict[str, Any] = {}
        self._raw_client: Any = None
        self._postings_script: Any = None
        self._query_script: Any = None
        self._heads = KeptHeads()

    # -- plumbing ---------------------------------------------------------------

    def _redis(self) -> Any:
        if self._client is None:
            try:
                import redis.asyncio as aioredis
            except ImportError as exc:
                raise MissingExtra("redis", "redis") from exc
            self._client = aioredis.Redis.from_url(self.url, decode_responses=True)
            self._scripts = {
                name: self._client.register_script(getattr(lua, name)) for name in lua.__all__
            }
        return self._client

    @asynccontextmanager
    async def _guard(self) -> AsyncIterator[Any]:
        """The client; the one place redis-py and socket errors become StoreError."""
        client = self._redis()
        try:
            yield client
        except (ConflictError, LockNotAcquired):
            raise
        except Exception as exc:
            if being_cancelled():
                # A cancel interrupted the call and the driver's cleanup failed on the dead
                # connection: stay cancelled rather than turn the cancel into a StoreError.
                raise asyncio.CancelledError() from exc
            if (error := translate(exc, redis_errors(), f"Redis store failed: {exc}")) is not None:
                raise error from exc
            raise

    async def _script(self, name: str, keys: list[str], args: list[Any]) -> Any:
        async with self._guard():
            return await self._scripts[name](keys=keys, args=args)

    async def _erase(
        self, tenant: str, session_id: str, cutoff: int | str, record: str = ""
    ) -> dict[str, int]:
        """Run the ERASE script: the session and every registered kind; counts ({} = kept)."""
        self._heads.forget((tenant, session_id))  # its last turn, kept for the next append
        k = self._keys(tenant, session_id)
        path = k["member"]
        keys = [k["sess"], k["ix"], k["idle"], k["users"],
                *(f"{self.namespace}{kind.prefix}:{path}" for kind in REDIS_SESSION_KEYS)]
        args = [session_id, path, cutoff, k["user_prefix"], record,
                *(f"{kind.kind}|{'*' if kind.lists_keys else ''}{kind.count_fields}"
                  for kind in REDIS_SESSION_KEYS)]
        flat = await self._script("ERASE", keys, args)
        return {str(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}

    def _keys(self, tenant: str, session_id: str) -> dict[str, str]:
        path = f"{tenant}/{session_id}"
        ns = self.namespace
        return {
            "sess": f"{ns}s:{path}", "turns": f"{ns}t:{path}", "emo": f"{ns}e:{path}",
            "jobs": f"{ns}j:{path}", "ix": f"{ns}ix:{tenant}", "idle": f"{ns}idle",
            "lock": f"{ns}lock:{path}", "member": path, "users": f"{ns}users:{tenant}",
            "user_prefix": f"{ns}u:{tenant}/",
            "traces": f"{ns}tr:{path}", "trace_turns": f"{ns}trn:{path}",
            "trace_ages": f"{ns}tra:{path}", "idempotency": f"{ns}idk:{path}",
            "trace_texts": f"{ns}trx:{path}", "trace_text_turns": f"{ns}trxl:{path}",
            "rpostings": f"{ns}rp:{path}", "rindex": f"{ns}ri:{path}",
        }

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        await self._close_raw()

    # -- turn log ---------------------------------------------------------------

    async def append(self, given: AppendInput, *, expected_last_seq: int | None = None) -> list[Turn]:
        # Analysed once (by the front), before any script: a redone append only renumbers the postings.
        (tenant, session_id), user_id, turns, analyzed = given.key, given.user_id, given.turns, given.analyzed
        k = self._keys(tenant, session_id)
        answer = max((i for i, t in enumerate(turns, start=1) if t.role == "assistant"), default=0)
        args: list[Any] = [
            "" if expected_last_seq is None else expected_last_seq, now_micros(), session_id,
            k["member"], answer, len(turns), user_id or "", k["user_prefix"],
        ]
        for turn in turns:
            args += [encode_turn(turn), "" if turn.emotion is None else repr(float(turn.emotion)),
                     turn.content]
        keys = [k["sess"], k["turns"], k["emo"], k["ix"], k["idle"], k["users"],
                k["rpostings"], k["rindex"]]
        ok, head = 3, None
        while ok == 3:  # another writer moved the session meanwhile: compute again
            head = await self.index_head(k, (tenant, session_id)) if turns else None
            index = index_rows(head, turns, analyzed) if head is not None else [""]
            reply = await self._script("APPEND", keys, args + index)
            ok, last = int(reply[0]), int(reply[1])
        if ok == 1 and turns:
            self.head_after((tenant, session_id), last, turns, args[-3], indexed=reply[2] == 1)
        if ok == 2:
            raise owner_error(session_id)
        if not ok:
            raise ConflictError(
                f"session {session_id!r} is at seq {last}, expected {expected_last_seq}"
            )
        return [
            decode_turn(last + i, encode_turn(t), None if t.emotion is None else repr(float(t.emotion)))
            for i, t in enumerate(turns, start=1)
        ]

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
        k = self._keys(tenant, session_id)
        reply = await self._script(
            "LOAD", [k["sess"], k["turns"], k["emo"]],
            [recent, max_uncovered, key_moments, repr(float(key_moment_threshold))],
        )
        if not reply:
            return SessionState(tenant=tenant, session_id=session_id)
        heads, tail, tail_scores, moment_seqs, moment_docs, moment_scores = reply
        (last_seq, covers, created, updated, answer, s_text, s_tokens, s_version, s_created,
         constraints, constraints_version) = heads
        first = int(last_seq) - len(tail) + 1
        summary = None
        if int(s_version or 0):
            summary = Summary(text=s_text, covers_seq=int(covers), tokens=int(s_tokens),
                              version=int(s_version), created_at=from_micros(int(s_created)))
        return SessionState(
            tenant=tenant,
            session_id=session_id,
            last_seq=int(last_seq),
            turns=tuple(decode_turn(first + i, doc, score)
                        for i, (doc, score) in enumerate(zip(tail, tail_scores, strict=True))
                        if doc),  # a turn a retention policy erased is skipped
            summary=summary,
            constraints=constraints_from_json(constraints),
            constraints_version=int(constraints_version or 0),
            key_moments=tuple(decode_turn(int(seq), doc, score) for seq, doc, score
                              in zip(moment_seqs, moment_docs, moment_scores, strict=True) if doc),
            last_answer=answer,
            created_at=from_micros(int(created)),
            updated_at=from_micros(int(updated)),
        )

    async def turns(
        self, tenant: str, session_id: str, *, from_seq: int = 1, to_seq: int | None = None
    ) -> list[Turn]:
        k = self._keys(tenant, session_id)
        async with self._guard() as client:
            # A bounded range needs no read of last_seq: seqs past it are simply absent.
            upper = to_seq if to_seq is not None else int(await client.hget(k["sess"], "last_seq") or 0)
            return await _read_seqs(client, k, list(range(max(1, from_seq), upper + 1)))

    async def turns_at(self, tenant: str, session_id: str, seqs: Sequence[int]) -> list[Turn]:
        k = self._keys(tenant, session_id)
        async with self._guard() as client:
            return await _read_seqs(client, k, sorted({int(s) for s in seqs if int(s) >= 1}))

    async def version(self, tenant: str, session_id: str) -> SessionVersion:
        async with self._guard() as client:
            row = await client.hmget(
                self._keys(tenant, session_id)["sess"],
                ["last_seq", "summary_version", "constraints_version", "emotions_version",
                 "created_at"],
            )
        if row[0] is None:
            return SessionVersion()
        last, summary, constraints, emotions, created = (int(v or 0) for v in row)
        return SessionVersion(last_seq=last, summary_version=summary,
                              constraints_version=constraints, emotions_version=emotions,
                              created_at=from_micros(created))

    # -- derived records --------------------------------------------------------

    async def commit_summary(
        self, tenant: str, session_id: str, summary: Summary, *, expected_version: int
    ) -> bool:
        k = self._keys(tenant, session_id)
        args = [expected_version, summary.text, summary.covers_seq, summary.tokens,
                to_micros(summary.created_at)]
        return bool(await self._script("COMMIT_SUMMARY", [k["sess"]], args))

    async def commit_constraints(
        self,
        tenant: str,
        session_id: str,
        constraints: Sequence[Constraint],
        *,
        expected_version: int,
    ) -> bool:
        k = self._keys(tenant, session_id)
        args = [expected_version, constraints_to_json(constraints)]
        return bool(await self._script("COMMIT_CONSTRAINTS", [k["sess"]], args))

    async def set_emotions(self, tenant: str, session_id: str, scores: Mapping[int, float]) -> None:
        k = self._keys(tenant, session_id)
        args: list[Any] = []
        for seq, score in scores.items():
            args += [int(seq), repr(float(score))]
        if args:
            await self._script("SET_EMOTIONS", [k["sess"], k["emo"]], args)

    async def record_job(
        self, tenant: str, session_id: str, job: str, *, ok: bool, error: str | None = None,
        rejected: bool = False,
    ) -> None:
        k = self._keys(tenant, session_id)
        args = [job, int(ok), error or "", now_micros(), int(not ok and rejected)]
        await self._script("RECORD_JOB", [k["sess"], k["jobs"]], args)

    # -- administration ---------------------------------------------------------

    async def _infos(self, client: Any, tenant: str, sids: list[str]) -> list[SessionInfo]:
        async with client.pipeline(transaction=False) as pipe:
            for sid in sids:
                k = self._keys(tenant, sid)
                pipe.hmget(k["sess"], ["last_seq", "created_at", "updated_at",
                                       "summary_covers_seq", "summary_version",
                                       "constraints_version", "user_id"])
                pipe.hgetall(k["jobs"])
            replies = await pipe.execute()
        infos = []
        for sid, row, raw_jobs in zip(sids, replies[::2], replies[1::2], strict=True):
            if row[0] is None:
                continue  # deleted between the index read and this one
            counters: dict[str, dict[str, str]] = {}
            for field, value in raw_jobs.items():
                kind, _, job = field.partition(":")
                counters.setdefault(job, {})[kind] = value
            jobs = {
                job: JobStats(ok=int(c.get("ok", 0)), failed=int(c.get("failed", 0)),
                              rejected=int(c.get("rejected", 0)),
                              last_error=c.get("error") or None,
                              last_run=from_micros(int(c["run"])) if "run" in c else None)
                for job, c in counters.items()
            }
            infos.append(SessionInfo(
                tenant=tenant, session_id=sid, last_seq=int(row[0]),
                created_at=from_micros(int(row[1])), updated_at=from_micros(int(row[2])),
                summary_covers_seq=int(row[3] or 0), summary_version=int(row[4] or 0),
                constraints_version=int(row[5] or 0), jobs=jobs, user_id=row[6],
            ))
        return infos

    async def info(self, tenant: str, session_id: str) -> SessionInfo | None:
        async with self._guard() as client:
            infos = await self._infos(client, tenant, [session_id])
        return infos[0] if infos else None

    async def list_sessions(
        self, tenant: str, *, limit: int = 100, offset: int = 0, user_id: str | None = None
    ) -> list[SessionInfo]:
        if limit <= 0:
            return []
        index = (f"{self.namespace}ix:{tenant}" if user_id is None
                 else f"{self.namespace}u:{tenant}/{user_id}")
        async with self._guard() as client:
            sids = await client.zrevrange(index, offset, offset + limit - 1)
            return await self._infos(client, tenant, list(sids))

    async def delete(self, tenant: str, session_id: str) -> bool:
        return (await self._erase(tenant, session_id, "")).get("sessions", 0) == 1

    async def purge_idle(self, older_than: datetime) -> int:
        cutoff = to_micros(older_than)
        async with self._guard() as client:
            members = await client.zrangebyscore(f"{self.namespace}idle", "-inf", f"({cutoff}")
        purged = 0
        for member in members:
            tenant, _, session_id = member.partition("/")
            # The script re-checks updated_at: a session written since the index read survives.
            purged += (await self._erase(tenant, session_id, cutoff)).get("sessions", 0)
        return purged

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
        k = self._keys(tenant, session_id)
        cutoff = "" if older_than is None else to_micros(older_than)
        packed = await pack_trace_soon(trace)
        await self._script(
            "TRACE_PUT",
            [k["sess"], k["traces"], k["trace_turns"], k["trace_ages"], k["trace_texts"], k["trace_text_turns"]],
            [trace.turn, packed.body, keep, to_micros(trace.created_at), cutoff, TEXT_TURN_SLACK,
             *(part for pair in packed.texts.items() for part in pair)],
        )

    async def get_trace(self, tenant: str, session_id: str, turn: int) -> TurnTrace | None:
        k = self._keys(tenant, session_id)
        async with self._raw() as client:
            body = await client.hget(k["traces"], str(turn))
            if body is None:
                return None
            reading = read_trace(body.decode() if body[:1] == b"{" else bytes(body))
            if not isinstance(reading, TraceReading):
                return reading
            seqs, keys = sorted(reading.seqs), sorted(reading.keys)
            turns = await client.hmget(k["turns"], [str(s) for s in seqs]) if seqs else []
            texts = await client.hmget(k["trace_texts"], keys) if keys else []
        return reading.rebuild(
            {s: json.loads(t)[1] for s, t in zip(seqs, turns, strict=True) if t is not None},
            {key: bytes(t) for key, t in zip(keys, texts, strict=True) if t is not None},
        )

    async def delete_traces(self, tenant: str, session_id: str) -> int:
        k = self._keys(tenant, session_id)
        async with self._guard() as client:
            pipe = client.pipeline(transaction=True)
            pipe.hlen(k["traces"])
            pipe.delete(k["traces"], k["trace_turns"], k["trace_ages"], k["trace_texts"], k["trace_text_turns"])
            count, _ = await pipe.execute()
        return int(count)

    async def session_bytes(self, tenant: str, session_id: str) -> dict[str, int]:
        """Bytes the session keeps by kind of record (`store.usage`)."""
        k = self._keys(tenant, session_id)
        async with self._guard() as client:
            return await redis_session_bytes(client, self.namespace, k["member"])

    # -- job locks --------------------------------------------------------------

    @asynccontextmanager
    async def hold(self, path: str, ttl_s: float) -> AsyncIterator[LockHandle]:
        """Hold lock ``path`` (`store.front.Driver.hold`)."""
        key = self._lock_key(path)
        async with self._guard() as client:
            token = int(await client.incr(f"{self.namespace}fence"))
            taken = await client.set(key, token, nx=True, px=max(1, int(ttl_s * 1000)))
        if not taken:
            raise LockNotAcquired(f"job lock {path!r} is held")
        try:
            yield LockHandle(key=path, token=token)
        finally:
            await self._script("RELEASE_LOCK", [key], [token])

    def _lock_key(self, path: str) -> str:
        """The Redis key of lock ``path``: ``tenant/session`` (a job lock, beside the
        session's keys) or ``tenant/session#turn`` (a turn lock)."""
        if path.endswith("#turn"):
            return f"{self.namespace}turnlock:{path.removesuffix('#turn')}"
        tenant, _, session_id = path.partition("/")
        return self._keys(tenant, session_id)["lock"]

    async def release(self, handle: LockHandle) -> None:
        await self._script("RELEASE_LOCK", [self._lock_key(handle.key)], [handle.token])

    # -- idempotency records (one string key each, expiring by itself) -----------

    def _idempotency_key(self, tenant: str, key: str) -> str:
        return f"{self.namespace}idem:{tenant}:{key}"

    async def claim_idempotency(
        self, tenant: str, key: str, fingerprint: str, *, session_id: str, lease_s: float
    ) -> IdempotencyRecord | None:
        name = self._idempotency_key(tenant, key)
        listed = self._keys(tenant, session_id)["idempotency"]
        running = json.dumps({"fingerprint": fingerprint, "status": 0, "response": "",
                              "session_id": session_id})
        async with self._guard() as client:
            for _ in range(3):  # a record read as live may lapse before the next command
                if await client.set(name, running, nx=True, px=max(1, int(lease_s * 1000))):
                    # The session's list of record keys, for erasure; it outlives its records.
                    await self._list_idempotency(listed, name, lease_s)
                    return None
                raw = await client.get(name)
                if raw is not None:
                    held = json.loads(raw)
                    return IdempotencyRecord(fingerprint=held["fingerprint"], status=held["status"],
                                             response=held["response"])
        raise StoreError(f"idempotency record {key!r} changed three times while being claimed")

    async def _list_idempotency(self, listed: str, name: str, ttl_s: float) -> None:
        """Add ``name`` to the session's set ``listed``, which lives at least ``ttl_s`` more."""
        await self._scripts["LIST_KEY"](keys=[listed], args=[name, max(1, int(ttl_s * 1000))])

    async def finish_idempotency(
        self, tenant: str, key: str, *, status: int, response: str, ttl_s: float
    ) -> None:
        name = self._idempotency_key(tenant, key)
        async with self._guard() as client:
            raw = await client.get(name)
            if raw is not None:
                record = {**json.loads(raw), "status": status, "response": response}
                if await client.set(name, json.dumps(record), xx=True, px=max(1, int(ttl_s * 1000))):
                    listed = self._keys(tenant, record["session_id"])["idempotency"]
                    await self._list_idempotency(listed, name, ttl_s)

    async def release_idempotency(self, tenant: str, key: str) -> None:
        async with self._guard() as client:
            await client.delete(self._idempotency_key(tenant, key))
