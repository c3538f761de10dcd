"""The in-memory store: one process, no persistence. For tests, demos and the contract baseline."""

from __future__ import annotations

import asyncio
import bisect
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime

from ...errors import ConflictError, LockNotAcquired
from ...types import Constraint, SessionState, Summary, Turn, utc_now
from .._codec import check_owner, window_start
from ..base import (
    IdempotencyRecord,
    JobStats,
    LockHandle,
    OwnConnections,
    SessionInfo,
    SessionVersion,
)
from ..lifecycle import DeletionRecord, Scope, UserInfo, merge_counts
from ..postings import AppendInput
from ..records import TurnTrace
from ..trace_pack import TEXT_TURN_SLACK, PackedTrace, TraceReading, pack_trace_soon, read_trace

__all__ = ["MemoryDriver"]


@dataclass
class _Session:
    created_at: datetime
    updated_at: datetime
    turns: list[Turn] = field(default_factory=list)
    summary: Summary | None = None
    constraints: list[Constraint] = field(default_factory=list)
    constraints_version: int = 0
    emotions_version: int = 0
    strength: list[tuple[float, int]] = field(default_factory=list)
    """Emotion index: ``(-emotion, -seq)`` sorted, strongest (then newest) first."""
    last_answer: str | None = None
    jobs: dict[str, JobStats] = field(default_factory=dict)
    traces: dict[int, PackedTrace] = field(default_factory=dict)
    """Kept traces by exchange number, as every store keeps them (`store.trace_pack`)."""
    trace_texts: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    """Texts the traces refer to: key → (packed text, newest turn number referring to it)."""
    user_id: str | None = None


def _kept(turns: list[Turn]) -> list[Turn]:
    """``turns`` without the placeholders of turns a retention policy erased."""
    return [t for t in turns if not t.metadata.get("erased")]


class MemoryDriver(OwnConnections):
    """Keeps every session in a dict; safe for concurrent tasks of one event loop."""

    def __init__(self) -> None:
        self._sessions: dict[tuple[str, str], _Session] = {}
        self._guard = asyncio.Lock()
        self._locks: dict[str, tuple[int, float]] = {}
        self._fence = 0
        self._idempotency: dict[tuple[str, str], tuple[IdempotencyRecord, float, str]] = {}
        """Per (tenant, key): the record, when it lapses (monotonic) and its session id."""
        self._deletions: list[DeletionRecord] = []

    async def append(self, given: AppendInput, *, expected_last_seq: int | None = None) -> list[Turn]:
        key, user_id, turns = given.key, given.user_id, given.turns
        session_id = key[1]
        async with self._guard:
            now = utc_now()
            session = self._sessions.get(key)
            last_seq = len(session.turns) if session else 0
            if expected_last_seq is not None and expected_last_seq != last_seq:
                raise ConflictError(
                    f"session {session_id!r} is at seq {last_seq}, expected {expected_last_seq}"
                )
            check_owner(session.user_id if session else None, user_id, session_id)
            if not turns:
                return []
            if session is None:
                session = self._sessions[key] = _Session(created_at=now, updated_at=now)
            session.user_id = session.user_id or user_id
            stored = [
                Turn(
                    seq=last_seq + i,
                    role=t.role,
                    content=t.content,
                    tokens=t.tokens,
                    created_at=t.created_at,
                    emotion=t.emotion,
                    metadata=dict(t.metadata),
                )
                for i, t in enumerate(turns, start=1)
            ]
            session.turns.extend(stored)
            for turn in stored:
                if turn.emotion is not None:
                    bisect.insort(session.strength, (-turn.emotion, -turn.seq))
            session.emotions_version += any(t.emotion is not None for t in stored)
            for turn in stored:
                if turn.role == "assistant":
                    session.last_answer = turn.content
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
        key = (tenant, session_id)
        session = self._sessions.get(key)
        if session is None:
            return SessionState(tenant=tenant, session_id=session_id)
        covers = session.summary.covers_seq if session.summary else 0
        last_seq = len(session.turns)
        tail = _kept(session.turns[window_start(last_seq, covers, recent, max_uncovered) - 1 :])
        moments: list[Turn] = []
        if key_moments > 0:
            first_tail = tail[0].seq if tail else last_seq + 1
            # Walks the emotion index from the strongest: O(key_moments + tail), not O(history).
            for neg_emotion, neg_seq in session.strength:
                if -neg_emotion < key_moment_threshold or len(moments) == key_moments:
                    break
                if -neg_seq < first_tail:
                    moments.append(session.turns[-neg_seq - 1])
            moments.sort(key=lambda t: t.seq)
        return SessionState(
            tenant=tenant,
            session_id=session_id,
            last_seq=last_seq,
            turns=tuple(tail),
            summary=session.summary,
            constraints=tuple(session.constraints),
            constraints_version=session.constraints_version,
            key_moments=tuple(moments),
            last_answer=session.last_answer,
            created_at=session.created_at,
            updated_at=session.updated_at,
        )

    async def turns(
        self, tenant: str, session_id: str, *, from_seq: int = 1, to_seq: int | None = None
    ) -> list[Turn]:
        session = self._sessions.get((tenant, session_id))
        if session is None:
            return []
        end = len(session.turns) if to_seq is None else min(to_seq, len(session.turns))
        return _kept(session.turns[max(0, from_seq - 1) : max(0, end)])

    async def turns_at(self, tenant: str, session_id: str, seqs: Sequence[int]) -> list[Turn]:
        session = self._sessions.get((tenant, session_id))
        if session is None:
            return []
        return _kept([session.turns[s - 1] for s in sorted(set(seqs)) if 1 <= s <= len(session.turns)])

    async def version(self, tenant: str, session_id: str) -> SessionVersion:
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

    async def commit_summary(
        self, tenant: str, session_id: str, summary: Summary, *, expected_version: int
    ) -> bool:
        key = (tenant, session_id)
        async with self._guard:
            session = self._sessions.get(key)
            if session is None:
                return False
            current = session.summary
            version = current.version if current else 0
            if version != expected_version:
                return False
            if summary.covers_seq <= (current.covers_seq if current else 0):
                return False
            if summary.covers_seq > len(session.turns):
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
        key = (tenant, session_id)
        async with self._guard:
            session = self._sessions.get(key)
            if session is None or session.constraints_version != expected_version:
                return False
            session.constraints = list(constraints)
            session.constraints_version += 1
            return True

    async def set_emotions(self, tenant: str, session_id: str, scores: Mapping[int, float]) -> None:
        key = (tenant, session_id)
        async with self._guard:
            session = self._sessions.get(key)
            if session is None:
                return
            changed = False
            for seq, score in scores.items():
                old = session.turns[seq - 1].emotion if 1 <= seq <= len(session.turns) else score
                if old != score:
                    if old is not None:
                        session.strength.remove((-old, -seq))
                    bisect.insort(session.strength, (-float(score), -seq))
                    session.turns[seq - 1] = replace(session.turns[seq - 1], emotion=float(score))
                    changed = True
            session.emotions_version += changed

    async def record_job(
        self, tenant: str, session_id: str, job: str, *, ok: bool, error: str | None = None,
        rejected: bool = False,
    ) -> None:
        session = self._sessions.get((tenant, session_id))
        if session is None:
            return
        stats = session.jobs.get(job, JobStats())
        session.jobs[job] = JobStats(
            ok=stats.ok + ok,
            failed=stats.failed + (not ok and not rejected),
            rejected=stats.rejected + (not ok and rejected),
            last_error=None if ok else error,
            last_run=utc_now(),
        )

    def _info(self, key: tuple[str, str], session: _Session) -> SessionInfo:
        return SessionInfo(
            tenant=key[0],
            session_id=key[1],
            last_seq=len(session.turns),
            created_at=session.created_at,
            updated_at=session.updated_at,
            summary_covers_seq=session.summary.covers_seq if session.summary else 0,
            summary_version=session.summary.version if session.summary else 0,
            constraints_version=session.constraints_version,
            jobs=dict(session.jobs),
            user_id=session.user_id,
        )

    async def info(self, tenant: str, session_id: str) -> SessionInfo | None:
        key = (tenant, session_id)
        session = self._sessions.get(key)
        return self._info(key, session) if session else None

    async def list_sessions(
        self, tenant: str, *, limit: int = 100, offset: int = 0, user_id: str | None = None
    ) -> list[SessionInfo]:
        mine = [
            (k, s) for k, s in self._sessions.items()
            if k[0] == tenant and (user_id is None or s.user_id == user_id)
        ]
        mine.sort(key=lambda ks: ks[1].updated_at, reverse=True)
        return [self._info(k, s) for k, s in mine[offset : offset + limit]]

    async def delete(self, tenant: str, session_id: str) -> bool:
        key = (tenant, session_id)
        async with self._guard:
            self._erase_idempotency(*key)
            return self._sessions.pop(key, None) is not None

    async def purge_idle(self, older_than: datetime) -> int:
        async with self._guard:
            idle = [k for k, s in self._sessions.items() if s.updated_at < older_than]
            for k in idle:
                del self._sessions[k]
                self._erase_idempotency(*k)
            return len(idle)

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
        async with self._guard:
            session = self._sessions.get(key)
            if session is None:
                return
            session.traces[trace.turn] = packed
            for text_key, text in packed.texts.items():
                last = session.trace_texts.get(text_key, (b"", -TEXT_TURN_SLACK))[1]
                if last <= trace.turn - TEXT_TURN_SLACK:
                    session.trace_texts[text_key] = (text, trace.turn)
            newest = max(session.traces)
            for turn, kept in list(session.traces.items()):
                if (keep and turn <= newest - keep) or (older_than and kept.created_at < older_than):
                    del session.traces[turn]
            oldest = min(session.traces, default=newest + 1)
            for text_key, (_, last) in list(session.trace_texts.items()):
                if last < oldest - TEXT_TURN_SLACK:
                    del session.trace_texts[text_key]

    async def get_trace(self, tenant: str, session_id: str, turn: int) -> TurnTrace | None:
        session = self._sessions.get((tenant, session_id))
        kept = session.traces.get(turn) if session else None
        if session is None or kept is None:
            return None
        reading = read_trace(kept.body)
        if not isinstance(reading, TraceReading):
            return reading
        turns = {t.seq: t.content for t in _kept(session.turns) if t.seq in reading.seqs}
        texts = {k: session.trace_texts[k][0] for k in reading.keys if k in session.trace_texts}
        return reading.rebuild(turns, texts)

    async def delete_traces(self, tenant: str, session_id: str) -> int:
        key = (tenant, session_id)
        async with self._guard:
            session = self._sessions.get(key)
            if session is None:
                return 0
            count = len(session.traces)
            session.traces.clear()
            session.trace_texts.clear()
            return count

    # -- lifecycle ----------------------------------------------------------------

    async def list_users(self, tenant: str, *, limit: int = 100, offset: int = 0) -> list[UserInfo]:
        users: dict[str, list[_Session]] = {}
        for (t, _), session in self._sessions.items():
            if t == tenant and session.user_id is not None:
                users.setdefault(session.user_id, []).append(session)
        infos = [
            UserInfo(tenant=tenant, user_id=u, sessions=len(ss),
                     updated_at=max(s.updated_at for s in ss))
            for u, ss in users.items()
        ]
        infos.sort(key=lambda i: (i.updated_at, i.user_id), reverse=True)
        return infos[offset : offset + limit]

    async def list_tenants(self) -> list[str]:
        return sorted({t for t, _ in self._sessions})

    def _add_to_record(self, record_id: int | None, counts: Mapping[str, int]) -> None:
        for i, record in enumerate(self._deletions):
            if record.id == record_id:
                merged = merge_counts(dict(record.counts), counts)
                self._deletions[i] = replace(record, counts=merged)

    async def erase_session(
        self, tenant: str, session_id: str, *, record_id: int | None = None
    ) -> dict[str, int]:
        key = (tenant, session_id)
        async with self._guard:
            session = self._sessions.pop(key, None)
            counts = {"sessions": 0, "turns": 0, "summaries": 0, "pins": 0,
                      "emotion_scores": 0, "job_stats": 0, "traces": 0}
            if session is not None:
                counts.update(
                    sessions=1, turns=len(session.turns), summaries=int(session.summary is not None),
                    pins=len(session.constraints), emotion_scores=len(session.strength),
                    job_stats=len(session.jobs), traces=len(session.traces),
                )
            counts["idempotency"] = self._erase_idempotency(*key)
            self._add_to_record(record_id, counts)
            return counts

    async def erase_turns_before(
        self, tenant: str, session_id: str, seq: int, *, record_id: int | None = None
    ) -> dict[str, int]:
        key = (tenant, session_id)
        async with self._guard:
            session = self._sessions.get(key)
            counts = {"turns": 0, "emotion_scores": 0}
            if session is not None:
                # Turns stay addressable by seq: erased ones become empty placeholders
                # that `turns()` and `load()` skip.
                for i, turn in enumerate(session.turns[: max(0, seq - 1)]):
                    if turn.metadata.get("erased"):
                        continue
                    counts["turns"] += 1
                    if turn.emotion is not None:
                        counts["emotion_scores"] += 1
                        session.strength.remove((-turn.emotion, -turn.seq))
                    session.turns[i] = replace(
                        turn, content="", tokens=0, emotion=None, metadata={"erased": True}
                    )
            self._add_to_record(record_id, counts)
            return counts

    async def compact(self) -> None:
        return None

    async def open_deletion(
        self, tenant: str, scope: Scope, target: str, *, actor: str
    ) -> DeletionRecord:
        for record in self._deletions:
            if record.pending and (record.tenant, record.scope, record.target) == (
                    tenant, scope, target):
                return record
        record = DeletionRecord(id=len(self._deletions) + 1, tenant=tenant, scope=scope,
                                target=target, actor=actor, started_at=utc_now())
        self._deletions.append(record)
        return record

    async def finish_deletion(self, record_id: int, extra: Mapping[str, int]) -> DeletionRecord:
        self._add_to_record(record_id, extra)
        record = self._deletions[record_id - 1]
        if record.finished_at is None:
            record = self._deletions[record_id - 1] = replace(record, finished_at=utc_now())
        return record

    async def deletions(
        self, *, since_id: int = 0, pending_only: bool = False, limit: int = 100
    ) -> list[DeletionRecord]:
        found = [r for r in self._deletions if r.id > since_id and (r.pending or not pending_only)]
        return found[:limit]

    async def restore_session(
        self, tenant: str, session_id: str, *, user_id: str | None,
        created_at: datetime, updated_at: datetime,
    ) -> bool:
        session = self._sessions.get((tenant, session_id))
        if session is None:
            return False
        session.user_id = user_id
        session.created_at, session.updated_at = created_at, updated_at
        return True

    @asynccontextmanager
    async def hold(self, key: str, ttl_s: float) -> AsyncIterator[LockHandle]:
        """Hold lock ``key`` (`store.front.Driver.hold`)."""
        now = time.monotonic()
        held = self._locks.get(key)
        if held is not None and held[1] > now:
            raise LockNotAcquired(f"job lock {key!r} is held")
        self._fence += 1
        token = self._fence
        self._locks[key] = (token, now + ttl_s)
        try:
            yield LockHandle(key=key, token=token)
        finally:
            if self._locks.get(key, (None,))[0] == token:
                del self._locks[key]

    async def release(self, handle: LockHandle) -> None:
        if self._locks.get(handle.key, (None,))[0] == handle.token:
            del self._locks[handle.key]

    # -- idempotency records ----------------------------------------------------

    async def claim_idempotency(
        self, tenant: str, key: str, fingerprint: str, *, session_id: str, lease_s: float
    ) -> IdempotencyRecord | None:
        now = time.monotonic()
        held = self._idempotency.get((tenant, key))
        if held is not None and held[1] > now:
            return held[0]
        record = IdempotencyRecord(fingerprint=fingerprint, status=0, response="")
        self._idempotency[(tenant, key)] = (record, now + lease_s, session_id)
        return None

    async def finish_idempotency(
        self, tenant: str, key: str, *, status: int, response: str, ttl_s: float
    ) -> None:
        held = self._idempotency.get((tenant, key))
        if held is not None:
            record = replace(held[0], status=status, response=response)
            self._idempotency[(tenant, key)] = (record, time.monotonic() + ttl_s, held[2])

    def _erase_idempotency(self, tenant: str, session_id: str) -> int:
        """Drop the session's idempotency records (lapsed ones too); how many went."""
        mine = [k for k, held in self._idempotency.items() if k[0] == tenant and held[2] == session_id]
        for k in mine:
            del self._idempotency[k]
        return len(mine)

    async def release_idempotency(self, tenant: str, key: str) -> None:
        self._idempotency.pop((tenant, key), None)

    async def close(self) -> None:
        return None

