"""Export and import: every session of a store as JSON lines, streamed in bounded memory.

The format (version 1) is documented in docs/lifecycle.md. In short, one JSON
object per line, each with a ``type``:

``header`` · then per session ``session``, its ``turn`` lines (oldest first),
``summary`` and ``constraints`` (derived records, optional), ``end`` (turn
count and checksum) · and a closing ``footer`` (counts and a checksum of all).

Memory stays bounded by one page of turns (`PAGE`) whatever the size of the
store: sessions are listed a page at a time and turns read a page at a time.

A migration (``existing="resume"``) continues a session the target already holds
from its last turn, so one cut off half-way is resumed by running it again. An
import of a file (``contextmode import``) first reads the whole file with
`verify_export` (structure, every session's checksum, the footer) and writes
nothing if anything is wrong; then a session the target already holds is refused
(``existing="refuse"``; one identical to the archive's is skipped, so a re-run is
harmless), erased first (``"replace"``) or imported under another id (``rename``).
A session whose writing fails half-way is erased again: each session is imported
whole or not at all.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Literal

from ..errors import InputError, SessionExists
from ..store.base import Store
from ..store.lifecycle import LifecycleStore
from ..types import Constraint, JsonObject, NewTurn, SessionKey, Summary, Turn, utc_now
from .forget import forget, lifecycle_store

__all__ = [
    "FORMAT",
    "PAGE",
    "VERSION",
    "ExportPlan",
    "Footer",
    "ImportReport",
    "OnExisting",
    "export_records",
    "import_records",
    "store_digest",
    "verify_export",
]

FORMAT = "contextmode-export"
VERSION = 1
PAGE = 500
"""Turns read or written per store call, and sessions listed per call."""

Record = JsonObject
"""One line of an export, as written."""
Progress = Callable[[int], None]
"""Called with how many turns were just handled."""


def _iso(moment: datetime) -> str:
    return moment.isoformat()


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value)


def _canonical(record: Mapping[str, object]) -> bytes:
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
        """Count one session: its ids as the export names them (checked or not), its turns and checksum."""
        self.sessions += 1
        self.turns += turns
        self.digest ^= int(hashlib.sha256(f"{tenant}/{session_id}:{sha256}".encode()).hexdigest(), 16)

    def record(self) -> Record:
        return {"type": "footer", "sessions": self.sessions, "turns": self.turns,
                "sha256": f"{self.digest:064x}"}


async def _sessions(store: Store, tenants: Sequence[str] | None) -> AsyncIterator[SessionKey]:
    lifecycle = lifecycle_store(store)
    for tenant in tenants if tenants is not None else await lifecycle.list_tenants():
        offset = 0
        while True:
            page = await store.list_sessions(tenant, limit=PAGE, offset=offset)
            for info in page:
                yield SessionKey(tenant, info.session_id)
            if len(page) < PAGE:
                break
            offset += PAGE


async def _session_records(store: Store, key: SessionKey, derived: bool, footer: Footer) -> AsyncIterator[Record]:
    info = await store.info(key)
    if info is None:
        return  # deleted since it was listed
    yield {"type": "session", "tenant": key.tenant, "session_id": key.session_id, "user_id": info.user_id,
           "created_at": _iso(info.created_at), "updated_at": _iso(info.updated_at),
           "last_seq": info.last_seq}
    sha = hashlib.sha256()
    count = 0
    for start in range(1, info.last_seq + 1, PAGE):
        for turn in await store.turns(key, from_seq=start, to_seq=min(info.last_seq, start + PAGE - 1)):
            record = turn_record(turn, derived=derived)
            sha.update(_canonical(record))
            count += 1
            yield record
    if derived:
        state = await store.load(key, recent=0, max_uncovered=0)
        if state.summary is not None:
            s = state.summary
            yield {"type": "summary", "text": s.text, "covers_seq": s.covers_seq, "tokens": s.tokens,
                   "version": s.version, "created_at": _iso(s.created_at)}
        if state.constraints:
            yield {"type": "constraints", "version": state.constraints_version,
                   "items": [asdict(c) for c in state.constraints]}
    footer.add(key.tenant, key.session_id, count, sha.hexdigest())
    yield {"type": "end", "turns": count, "sha256": sha.hexdigest()}


async def export_records(
    store: Store, *, tenants: Sequence[str] | None = None, derived: bool = True
) -> AsyncIterator[Record]:
    """Every record of the export, header to footer (``tenants``: only those; default all)."""
    yield {"type": "header", "format": FORMAT, "version": VERSION, "exported_at": _iso(utc_now()),
           "derived": derived}
    footer = Footer()
    async for key in _sessions(store, tenants):
        async for record in _session_records(store, key, derived, footer):
            yield record
    yield footer.record()


async def session_digest(store: Store, key: SessionKey, *, derived: bool) -> tuple[int, str]:
    """Turn count and checksum of one stored session, as its export's ``end`` line would say."""
    end: Record = {}
    async for record in _session_records(store, key, derived, Footer()):
        end = record
    if not end:
        return 0, ""
    turns = end["turns"]
    return turns if isinstance(turns, int) else 0, str(end["sha256"])


@dataclass
class ExportPlan:
    """What `verify_export` found in a whole, checked export file."""

    derived: bool = True
    sessions: dict[tuple[str, str], tuple[int, str]] = field(default_factory=dict)
    """(tenant, session id) → (turns, sha256) of each session, in file order."""
    footer: Record = field(default_factory=dict)


class _Verifier:
    """Checks an export's structure and checksums, record by record (nothing is written)."""

    def __init__(self) -> None:
        self.plan = ExportPlan()
        self.started = False
        self.ended = False
        self.session: tuple[str, str] | None = None
        self.sha = hashlib.sha256()
        self.count = 0
        self.last_seq = 0
        self.footer = Footer()

    def feed(self, record: Mapping[str, Any]) -> None:
        kind = record.get("type")
        if self.ended:
            raise ValueError("records after the footer")
        if not self.started:
            if kind != "header" or record.get("format") != FORMAT or int(record.get("version", 0)) > VERSION:
                raise ValueError(f"the file does not start with a {FORMAT} header of version ≤ {VERSION}")
            self.started = True
            self.plan.derived = bool(record.get("derived", True))
            return
        if kind == "session":
            self._open(record)
        elif kind in ("turn", "summary", "constraints", "end"):
            if self.session is None:
                raise ValueError(f"a {kind} record outside a session")
            self._inside(kind, record)
        elif kind == "footer":
            self._close(record)
        else:
            raise ValueError(f"unknown record type {kind!r}")

    def _open(self, record: Mapping[str, Any]) -> None:
        if self.session is not None:
            raise ValueError(f"session {self.session[1]!r} has no end line")
        key = (str(record["tenant"]), str(record["session_id"]))
        if key in self.plan.sessions:
            raise ValueError(f"session {key[1]!r} appears twice")
        _time(record["created_at"]), _time(record["updated_at"])
        self.session, self.sha, self.count, self.last_seq = key, hashlib.sha256(), 0, 0

    def _inside(self, kind: str, record: Mapping[str, Any]) -> None:
        assert self.session is not None
        if kind == "turn":
            if int(record["seq"]) <= self.last_seq:
                raise ValueError(f"turn {record['seq']} of session {self.session[1]!r} is out of order")
            self.last_seq = int(record["seq"])
            self.sha.update(_canonical(record))
            self.count += 1
        elif kind == "end":
            digest = self.sha.hexdigest()
            if int(record["turns"]) != self.count or record["sha256"] != digest:
                raise ValueError(f"session {self.session[1]!r} does not match its checksum "
                                 f"({self.count} turns read, {record['turns']} announced): the file was changed or cut")
            self.plan.sessions[self.session] = (self.count, digest)
            self.footer.add(*self.session, self.count, digest)
            self.session = None

    def _close(self, record: Mapping[str, Any]) -> None:
        if self.session is not None:
            raise ValueError(f"session {self.session[1]!r} has no end line")
        if record.get("sha256") != self.footer.record()["sha256"] or record.get("turns") != self.footer.turns \
                or record.get("sessions") != self.footer.sessions:
            raise ValueError("the footer's counts or checksum do not match the sessions read")
        self.plan.footer = dict(record)
        self.ended = True


async def verify_export(records: AsyncIterator[Mapping[str, Any]]) -> ExportPlan:
    """Read a whole export and check it without writing anything: the header first, each
    session closed by its ``end`` line with the right count and SHA-256, no session twice,
    and the footer last with the right totals. `InputError` names the first problem."""
    verifier = _Verifier()
    line = 0
    async for record in records:
        line += 1
        try:
            verifier.feed(record)
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"line {line}: {exc}") from None
    if not verifier.ended:
        raise InputError("the export has no footer line (truncated file?); nothing was imported")
    return verifier.plan


async def store_digest(store: Store, *, tenants: Sequence[str] | None = None) -> Footer:
    """Counts and checksum of ``store``'s sessions and turns (what `migrate` compares)."""
    footer = Footer()
    async for key in _sessions(store, tenants):
        async for _ in _session_records(store, key, False, footer):
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
    skipped_sessions: int = 0
    """Sessions the target already held, identical to the export's (a repeated import)."""
    footer: Record = field(default_factory=dict)
    """The footer line read (counts and checksum of the export)."""


OnExisting = Literal["resume", "refuse", "replace"]
"""What an import does with a session the target already holds: continue it from its last
turn (a migration), refuse it (skip it when identical), or erase it first."""


@dataclass
class _Target:
    key: SessionKey
    user_id: str | None
    created_at: datetime
    updated_at: datetime
    last_seq: int
    skip: bool = False
    """Already held, identical: nothing of it is written."""
    buffer: list[NewTurn] = field(default_factory=list)
    summary: Summary | None = None
    constraints: list[Constraint] | None = None


@dataclass(frozen=True, kw_only=True)
class _Rules:
    existing: OnExisting = "resume"
    plan: ExportPlan | None = None
    rename: str | None = None


class _Importer:
    def __init__(self, store: LifecycleStore, progress: Progress | None, rules: _Rules) -> None:
        self.store = store
        self.progress = progress
        self.rules = rules
        self.report = ImportReport()
        self.current: _Target | None = None
        self.renamed = 0

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
        tenant, session_id = record["tenant"], record["session_id"]
        if self.rules.rename is not None:
            self.renamed += 1
            if self.renamed > 1:
                raise ValueError("a new session id is given, but the export holds more than one session")
            session_id = self.rules.rename
        key = SessionKey(tenant, session_id)
        info = await self.store.info(key)
        skip = False
        if info is not None and self.rules.existing != "resume":
            skip = await self._existing(key, (record["tenant"], record["session_id"]))
        self.current = _Target(
            key=key, user_id=record.get("user_id"),
            created_at=_time(record["created_at"]), updated_at=_time(record["updated_at"]),
            last_seq=info.last_seq if info and not skip and self.rules.existing == "resume" else 0, skip=skip,
        )

    async def _existing(self, key: SessionKey, archived: tuple[str, str]) -> bool:
        """Handle a session the target already holds: True to skip it (identical), else erase it
        (``replace``) or raise (``refuse``)."""
        plan = self.rules.plan
        if self.rules.existing == "replace":
            await forget(self.store, key.tenant, "session", key.session_id, actor="import")
            return False
        if plan is not None and self.rules.rename is None and plan.sessions.get(archived) == await session_digest(
            self.store, key, derived=plan.derived
        ):
            self.report.skipped_sessions += 1
            return True
        raise SessionExists(
            f"session {key.session_id!r} of tenant {key.tenant!r} already exists and differs from the export; "
            "import with --replace to overwrite it, or --as NEW_ID to import it under another id"
        )

    def _session(self) -> _Target:
        if self.current is None:
            raise ValueError("a record before its session line")
        return self.current

    async def _on_turn(self, record: Mapping[str, Any]) -> None:
        target = self._session()
        if target.skip:
            self.report.skipped_turns += 1
            return
        if record["seq"] <= target.last_seq:
            self.report.skipped_turns += 1
            return
        expected = target.last_seq + len(target.buffer) + 1
        if record["seq"] != expected:
            # Appends number turns without gaps: turns a retention policy erased cannot be
            # re-created, and renumbering would break summaries and reply_to links.
            raise ValueError(f"session {target.key.session_id!r} jumps to turn {record['seq']} "
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
            target.key, target.buffer,
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
        if target.skip:
            self.current = None
            return
        await self._flush(target)
        store, key = self.store, target.key
        state = await store.load(key, recent=0, max_uncovered=0)
        if target.summary is not None and state.summary_covers_seq < target.summary.covers_seq:
            await store.commit_summary(key, target.summary,
                                       expected_version=state.summary.version if state.summary else 0)
        if target.constraints is not None and list(state.constraints) != target.constraints:
            await store.commit_constraints(key, target.constraints,
                                           expected_version=state.constraints_version)
        await store.restore_session(key, user_id=target.user_id, created_at=target.created_at,
                                    updated_at=target.updated_at)
        self.report.sessions += 1
        self.current = None

    async def _on_footer(self, record: Mapping[str, Any]) -> None:
        self.report.footer = dict(record)

    async def undo_current(self) -> None:
        """Erase the session being written when its import failed (not when resuming)."""
        target = self.current
        if target is None or target.skip or self.rules.existing == "resume":
            return
        if target.last_seq or target.buffer:
            await self.store.erase_session(target.key)


async def import_records(
    store: Store,
    records: AsyncIterator[Mapping[str, Any]],
    *,
    progress: Progress | None = None,
    existing: OnExisting = "resume",
    plan: ExportPlan | None = None,
    rename: str | None = None,
) -> ImportReport:
    """Write an export's records into ``store``.

    ``existing`` says what happens to a session the store already holds (`OnExisting`);
    ``plan`` is `verify_export`'s reading of the same records (an identical session is then
    skipped rather than refused); ``rename`` imports the export's only session under that id.
    Unless resuming, a session whose writing fails is erased again (whole or nothing).
    """
    importer = _Importer(lifecycle_store(store), progress, _Rules(existing=existing, plan=plan, rename=rename))
    line = 0
    async for record in records:
        line += 1
        try:
            await importer.feed(record, line)
        except BaseException:
            await importer.undo_current()
            raise
    if importer.current is not None:
        await importer.undo_current()
        raise InputError(f"the export ends inside session {importer.current.key.session_id!r} (truncated file?)")
    return importer.report
