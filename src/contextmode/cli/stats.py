"""``contextmode stats SESSION``: the bytes a session keeps, by kind of record (`store.usage`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

__all__ = ["register", "session_stats"]


async def session_stats(url: str | None, tenant: str, session: str) -> dict[str, Any]:
    """Bytes by kind, their total, the exchanges and the raw text of both roles' turns."""
    from ..errors import SessionNotFound, UserError
    from ..store import open_store
    from ..store.records import exchange_count
    from ..store.usage import reports_usage

    store = open_store(url)
    usage: object = store
    try:
        if not reports_usage(usage):
            raise UserError(f"{type(store).__name__} does not report its size per session")
        if await store.info(tenant, session) is None:
            raise SessionNotFound(f"no session {session!r} for tenant {tenant!r}")
        kinds: Mapping[str, int] = await usage.session_bytes(tenant, session)
        turns = await store.turns(tenant, session)
    finally:
        await store.close()
    exchanges = exchange_count(turns) or sum(t.role == "user" for t in turns)
    total = sum(kinds.values())
    return {
        "session": session,
        "exchanges": exchanges,
        "raw_text_bytes": sum(len(t.content.encode()) for t in turns),
        "total_bytes": total,
        "per_exchange": round(total / exchanges) if exchanges else None,
        "bytes": dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
    }


def _table(stats: Mapping[str, Any]) -> Table:
    exchanges, total = stats["exchanges"], stats["total_bytes"] or 1
    table = Table(title=f"{stats['session']}: {stats['total_bytes']:,} bytes kept, {exchanges} exchanges,"
                        f" {stats['raw_text_bytes']:,} bytes of text typed and answered")
    table.add_column("kind of record")
    table.add_column("bytes", justify="right")
    table.add_column("share", justify="right")
    table.add_column("per exchange", justify="right")
    for kind, size in stats["bytes"].items():
        table.add_row(kind, f"{size:,}", f"{size / total:.0%}", f"{size / exchanges:,.0f}" if exchanges else "—")
    return table


def register(app: typer.Typer) -> None:
    """Add the ``stats`` command to ``app``."""

    @app.command("stats")
    def stats_command(
        session: Annotated[str, typer.Argument(help="Session id.")],
        store: Annotated[
            str | None,
            typer.Option("--store", help="Store URL (default: CONTEXTMODE_STORE_URL or SQLite under CONTEXTMODE_HOME)."),
        ] = None,
        tenant: Annotated[str, typer.Option("--tenant", help="Tenant of the session.")] = "local",
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    ) -> None:
        """Show how many bytes a session keeps, by kind of record (turns, traces, recall index…)."""
        stats = asyncio.run(session_stats(store, tenant, session))
        if as_json:
            print(json.dumps(stats, ensure_ascii=False))
        else:
            Console().print(_table(stats))
