"""``contextmode replay``: feed a recorded conversation and show each turn's context."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console
from rich.progress import track

from ..api import build_engine
from ..errors import InputError
from ..settings import EngineSettings
from ..types import SessionKey
from .render import prepared_panel

__all__ = ["ACCEPTED_FORMATS", "read_conversation", "run_replay"]

ACCEPTED_FORMATS = (
    'JSONL, one object per line: {"role": "user"|"assistant", "content": "..."} '
    'or {"user": "...", "assistant": "..."}'
)


def read_conversation(path: Path) -> Iterator[tuple[str, str]]:
    """(role, content) pairs from a JSONL file of ``{"role", "content"}`` or ``{"user", "assistant"}`` lines."""
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{path}:{number}: not JSON ({exc.msg}); accepted: {ACCEPTED_FORMATS}") from None
            if not isinstance(record, dict):
                raise InputError(f"{path}:{number}: expected a JSON object; accepted: {ACCEPTED_FORMATS}")
            if "role" in record:
                if record["role"] not in ("user", "assistant") or not isinstance(record.get("content"), str):
                    raise InputError(f"{path}:{number}: role must be user or assistant, content a string")
                yield record["role"], record["content"]
            elif any(isinstance(record.get(role), str) for role in ("user", "assistant")):
                for role in ("user", "assistant"):
                    if isinstance(record.get(role), str):
                        yield role, record[role]
            else:
                keys = ", ".join(sorted(record)[:5]) or "none"
                raise InputError(f"{path}:{number}: unrecognised line (keys: {keys}); accepted: {ACCEPTED_FORMATS}")


async def run_replay(
    console: Console, path: Path, *, session: str, store: str | None, settings: EngineSettings, quiet: bool
) -> None:
    turns = list(read_conversation(path))
    if not turns:
        raise InputError(f"{path}: no turns found; accepted: {ACCEPTED_FORMATS}")
    engine = build_engine(store=store, settings=settings)
    tenant = settings.tenant
    try:
        await engine.store.delete(SessionKey(tenant, session))
        for role, content in track(turns, description="replaying", console=console, disable=not quiet):
            if role == "user":
                prepared = await engine.prepare(tenant, session, content)
                if quiet:
                    console.print(f"{content[:30]!r}: {prepared.context.summary_line()}")
                else:
                    console.print(prepared_panel(prepared))
            await engine.record(tenant, session, role, content)  # type: ignore[arg-type]
            if role == "assistant":
                await engine.drain()
        console.print(f"replayed {len(turns)} turns into session {session!r}")
    finally:
        await engine.close()
