"""``contextmode stats SESSION``: the bytes a session keeps, by kind of record (`store.usage`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from ..types import SessionKey

__all__ = ["register", "session_stats"]


async def session_stats(url: str | None, tenant: str, session: str) -> dict[str, Any]:
    """Bytes by kind, their total, the exchanges and the raw text of both roles' turns."""
    from ..store import open_store
    from ..store.usage import session_storage

    store = open_store(url)
    try:
        usage = await session_storage(store, SessionKey(tenant, session))
    finally:
        await store.close()
    return {"session": session, **vars(usage), "bytes": dict(usage.bytes)}


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
