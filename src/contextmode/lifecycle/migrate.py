"""Files and migration: export to / import from a JSONL file, copy one store into another.

`migrate` streams every session of the source into the target through the
export records (bounded memory), then checks the two stores hold the same
sessions and turns by counts and checksums. Run it again after a crash: the
sessions already copied are skipped, a half-copied one continues from its last turn.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..errors import InputError
from ..store.base import Store
from ..types import JsonObject
from .export import Footer, ImportReport, export_records, import_records, store_digest

__all__ = ["MigrateReport", "migrate", "read_export", "write_export"]


def _open_write(path: Path | str) -> IO[str] | Any:
    if str(path) == "-":
        return nullcontext(sys.stdout)
    return open(path, "w", encoding="utf-8")


async def write_export(
    store: Store,
    path: Path | str,
    *,
    derived: bool = True,
    tenants: Sequence[str] | None = None,
    progress: Callable[[int], None] | None = None,
) -> JsonObject:
    """Write the export of ``store`` to ``path`` (``-``: standard output); return the footer line."""
    footer: JsonObject = {}
    with _open_write(path) as out:
        async for record in export_records(store, tenants=tenants, derived=derived):
            out.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")
            if record["type"] == "turn" and progress is not None:
                progress(1)
            elif record["type"] == "footer":
                footer = record
    return footer


async def read_export(path: Path | str) -> AsyncIterator[JsonObject]:
    """The records of an export file, one line at a time (``-``: standard input)."""
    handle = sys.stdin if str(path) == "-" else open(path, encoding="utf-8")  # noqa: SIM115
    try:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"line {number} of {str(path)!r} is not JSON: {exc.msg}") from None
            if not isinstance(record, dict):
                raise InputError(f"line {number} of {str(path)!r} is not a JSON object")
            yield record
    finally:
        if handle is not sys.stdin:
            handle.close()


@dataclass(frozen=True, kw_only=True)
class MigrateReport:
    """What a migration copied and whether both stores now hold the same data."""

    imported: ImportReport
    source: Footer
    target: Footer

    @property
    def verified(self) -> bool:
        """Same sessions, same turns, same checksum on both sides."""
        s, t = self.source, self.target
        return (s.sessions, s.turns, s.digest) == (t.sessions, t.turns, t.digest)


async def migrate(
    source: Store,
    target: Store,
    *,
    tenants: Sequence[str] | None = None,
    progress: Callable[[int], None] | None = None,
) -> MigrateReport:
    """Copy every session of ``source`` (derived records included) into ``target`` and verify."""
    imported = await import_records(target, export_records(source, tenants=tenants), progress=progress)
    return MigrateReport(
        imported=imported,
        source=await store_digest(source, tenants=tenants),
        target=await store_digest(target, tenants=tenants),
    )
