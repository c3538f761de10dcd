"""``contextmode index``: build the stored recall index for sessions written before it existed,
and convert sessions indexed in an older layout (see `store.postings.LAYOUT`)."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from ..errors import ContextModeError

__all__ = ["register"]


async def _run(console: Console, url: str | None, batch: int) -> None:
    from ..store import open_store
    from ..store.postings import catch_up, has_postings

    opened = open_store(url)
    try:
        store = opened
        if not has_postings(store):
            console.print(f"{type(opened).__name__} keeps its recall index in the process: nothing to build")
            return
        with Progress(
            TextColumn("indexing turns"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
            console=console,
        ) as progress:
            task = progress.add_task("index", total=None)

            def show(done: int, total: int) -> None:
                progress.update(task, completed=done, total=total)

            indexed = await catch_up(store, batch=batch, on_progress=show)
        console.print(f"recall index up to date: {indexed} turns indexed (safe to interrupt and run again)")
    finally:
        await opened.close()


def register(app: typer.Typer) -> None:
    """Add the ``index`` command to ``app``."""

    @app.command("index")
    def index_command(
        store: Annotated[
            str | None,
            typer.Option("--store", help="Store URL (default: CONTEXTMODE_STORE_URL or SQLite under CONTEXTMODE_HOME)."),
        ] = None,
        batch: Annotated[int, typer.Option(help="Turns indexed per transaction.", min=1)] = 2000,
    ) -> None:
        """Build the stored recall index for turns written before it existed, or convert an
        index of an older layout (resumable)."""
        console = Console()
        try:
            asyncio.run(_run(console, store, batch))
        except ContextModeError as exc:
            console.print(f"[red]{type(exc).__name__}: {exc}[/red]")
            raise typer.Exit(2) from None
