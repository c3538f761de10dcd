"""Export and import: every session of a store as JSON lines, streamed in bounded memory.

The format (version 1) is documented in docs/lifecycle.md. In short, one JSON
object per line, each with a ``type``:

``header`` · then per session ``session``, its ``turn`` lines (oldest first),
``summary`` and ``constraints`` (derived records, optional), ``end`` (turn
count and checksum) · and a closing ``footer`` (counts and a checksum of all).

Memory stays bounded by one page of turns (`PAGE`) whatever the size of the
store: sessions are listed a page at a time and turns read a page at a time.
Importing continues a session the target already holds from its last turn,
so an import (or a migration) cut off half-way is resumed by running it again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from ..errors import InputError
from ..store.base import Store
from ..store.lifecycle import LifecycleStore
from ..types import Constraint, NewTurn, Summary, Turn, utc_now
from .forget import lifecycle_store

__all__ = [
    "FORMAT",
    "PAGE",
    "VERSION",
    "Footer",
    "ImportReport",
    "export_records",
    "import_records",
    "store_digest",
]

FORMAT = "contextmode-export"
VERSION = 1
PAGE = 500
"""Turns read or written per store call, and sessions listed per call."""

Record = dict[str, Any]
Progress = Callable[[int], None]
"""Called with how many turns were just handled."""


def _iso(moment: datetime) -> str:
    return moment.isoformat()


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value)


def _canonical(record: Mapping[str, Any]) -> bytes:
    return json.dumps(record, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode()


def turn_record(turn: Turn, *, derived: bool) -> Record:
    """The ``turn`` line of ``turn`` (its emotion score only with ``derived``)."""
    return {
        "type": "turn", "seq": turn.seq, "role": turn.role, "content": turn.content,
        "tokens": turn.tokens, "created_at": _iso(turn.created_at),
        "metadata": dict(turn.metadata), "emotion": turn.emotion if derived else None,
    }


@dataclass
class Footer:
    """Counts and checksum of a whole export (order of sessions does not matter)."""

    sessions: int = 0
    turns: int = 0
    digest: int = 0
    """XOR of every session's SHA-256 (as an integer): independent of listing order."""

    def add(self, tenant: str, session_id: str, turns: int, sha256: str) -> None:
        self.sessions += 1
        self.turns += turns
        self.digest ^= int(hashlib.sha256(f"{tenant}/{session_id}:{sha256}".encode()).hexdigest(), 16)

    def record(self) -> Record:
        return {"type": "footer", "sessions": self.sessions, "turns": self.turns,
                "sha256": f"{self.digest:064x}"}


async def _sessions(store: Store, tenants: Sequence[str] | None) -> AsyncIterator[tuple[str, str]]:
    lifecycle = lifecycle_store(store)
    for tenant in tenants if tenants is not None else await lifecycle.list_tenants():
        offset = 0
        while True:
            page = await store.list_sessions(tenant, limit=PAGE, offset=offset)
            for info in page:
                yield tenant, info.session_id
            if len(page) < PAGE:
                break
            offset += PAGE


async def _session_records(
    store: Store, tenant: str, session_id: str, derived: bool, footer: Footer
) -> AsyncIterator[Record]:
    info = await store.info(tenant, session_id)
    if info is None:
        return  # deleted since it was listed
    yield {"type": "session", "tenant": tenant, "session_id": session_id, "user_id": info.user_id,
           "created_at": _iso(info.created_at), "updated_at": _iso(info.updated_at),
           "last_seq": info.last_seq}
    sha = hashlib.sha256()
    count = 0
    for start in range(1, info.last_seq + 1, PAGE):
        for turn in await store.turns(tenant, session_id, from_seq=start, to_seq=min(info.last_seq, start + PAGE - 1)):
            record = turn_record(turn, derived=derived)
            sha.update(_canonical(record))
            count += 1
            yield record
    if derived:
        state = await store.load(tenant, session_id, recent=0, max_uncovered=0)
        if state.summary is not None:
            s = state.summary
            yield {"type": "summary", "text": s.text, "covers_seq": s.covers_seq, "tokens": s.tokens,
                   "version": s.version, "created_at": _iso(s.created_at)}
        if state.constraints:
            yield {"type": "constraints", "version": state.constraints_version,
                   "items": [asdict(c) for c in state.constraints]}
    footer.add(tenant, session_id, count, sha.hexdigest())
    yield {"type": "end", "turns": count, "sha256": sha.hexdigest()}


async def export_records(
    store: Store, *, tenants: Sequence[str] | None = None, derived: bool = True
) -> AsyncIterator[Record]:
    """Every record of the export, header to footer (``tenants``: only those; default all)."""
    yield {"type": "header", "format": FORMAT, "version": VERSION, "exported_at": _iso(utc_now()),
           "derived": derived}
    footer = Footer()
    async for tenant, session_id in _sessions(store, tenants):
        async for record in _session_records(store, tenant, session_id, derived, footer):
            yield record
    yield footer.record()


async def store_digest(store: Store, *, tenants: Sequence[str] | None = None) -> Footer:
    """Counts and checksum of ``store``'s sessions and turns (what `migrate` compares)."""
    footer = Footer()
    async for tenant, session_id in _sessions(store, tenants):
        async for _ in _session_records(store, tenant, session_id, False, footer):
            pass
    return footer


@dataclass
class ImportReport:
    """What an import wrote."""

    sessions: int = 0
    turns: int = 0
    """Turns appended by this run."""
    skipped_turns: int = 0
    """Turns the target already held (a resumed import)."""
    footer: Record = field(default_factory=dict)
    """The footer line read (counts and checksum of the export)."""


@dataclass
class _Target:
    tenant: str
    session_id: str
    user_id: str | None
    created_at: datetime
    updated_at: datetime
    last_seq: int
    buffer: list[NewTurn] = field(default_factory=list)
    summary: Summary | None = None
    constraints: list[Constraint] | None = None


class _Importer:
    def __init__(self, store: LifecycleStore, progress: Progress | None) -> None:
        self.store = store
        self.progress = progress
        self.report = ImportReport()
        self.current: _Target | None = None

    async def feed(self, record: Mapping[str, Any], line: int) -> None:
        kind = record.get("type")
        try:
            handler = getattr(self, f"_on_{kind}")
        except AttributeError:
            raise InputError(f"line {line}: unknown record type {kind!r}") from None
        try:
            await handler(record)
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"line {line}: malformed {kind} record: {exc!r}") from exc

    async def _on_header(self, record: Mapping[str, Any]) -> None:
        if record["format"] != FORMAT or int(record["version"]) > VERSION:
            raise InputError(f"not a {FORMAT} file of version ≤ {VERSION}")

    async def _on_session(self, record: Mapping[str, Any]) -> None:
        info = await self.store.info(record["tenant"], record["session_id"])
        self.current = _Target(
            tenant=record["tenant"], session_id=record["session_id"], user_id=record.get("user_id"),
            created_at=_time(record["created_at"]), updated_at=_time(record["updated_at"]),
            last_seq=info.last_seq if info else 0,
        )

    def _session(self) -> _Target:
        if self.current is None:
            raise ValueError("a record before its session line")
        return self.current

    async def _on_turn(self, record: Mapping[str, Any]) -> None:
        target = self._session()
        if record["seq"] <= target.last_seq:
            self.report.skipped_turns += 1
            return
        expected = target.last_seq + len(target.buffer) + 1
        if record["seq"] != expected:
            # Appends number turns without gaps: turns a retention policy erased cannot be
            # re-created, and renumbering would break summaries and reply_to links.
            raise ValueError(f"session {target.session_id!r} jumps to turn {record['seq']} "
                             f"where {expected} was expected (turns erased by retention?)")
        emotion = record.get("emotion")
        target.buffer.append(NewTurn(
            role=record["role"], content=record["content"], tokens=int(record["tokens"]),
            created_at=_time(record["created_at"]), metadata=record.get("metadata") or {},
            emotion=None if emotion is None else float(emotion),
        ))
        if len(target.buffer) >= PAGE:
            await self._flush(target)

    async def _flush(self, target: _Target) -> None:
        if not target.buffer:
            return
        written = await self.store.append(
            target.tenant, target.session_id, target.buffer,
            expected_last_seq=target.last_seq, user_id=target.user_id,
        )
        target.last_seq = written[-1].seq
        self.report.turns += len(written)
        if self.progress is not None:
            self.progress(len(written))
        target.buffer = []

    async def _on_summary(self, record: Mapping[str, Any]) -> None:
        self._session().summary = Summary(
            text=record["text"], covers_seq=int(record["covers_seq"]), tokens=int(record["tokens"]),
            created_at=_time(record["created_at"]),
        )

    async def _on_constraints(self, record: Mapping[str, Any]) -> None:
        self._session().constraints = [Constraint(**item) for item in record["items"]]

    async def _on_end(self, record: Mapping[str, Any]) -> None:
        target = self._session()
        await self._flush(target)
        store, key = self.store, (target.tenant, target.session_id)
        state = await store.load(*key, recent=0, max_uncovered=0)
        if target.summary is not None and state.summary_covers_seq < target.summary.covers_seq:
            await store.commit_summary(*key, target.summary,
                                       expected_version=state.summary.version if state.summary else 0)
        if target.constraints is not None and list(state.constraints) != target.constraints:
            await store.commit_constraints(*key, target.constraints,
                                           expected_version=state.constraints_version)
        await store.restore_session(*key, user_id=target.user_id, created_at=target.created_at,
                                    updated_at=target.updated_at)
        self.report.sessions += 1
        self.current = None

    async def _on_footer(self, record: Mapping[str, Any]) -> None:
        self.report.footer = dict(record)


async def import_records(
    store: Store, records: AsyncIterator[Mapping[str, Any]], *, progress: Progress | None = None
) -> ImportReport:
    """Write an export's records into ``store``; resumable (see the module docstring)."""
    importer = _Importer(lifecycle_store(store), progress)
    line = 0
    async for record in records:
        line += 1
        await importer.feed(record, line)
    if importer.current is not None:
        raise InputError(f"the export ends inside session {importer.current.session_id!r} (truncated file?)")
    return importer.report
