"""Shared console output for the ``contextmode eval`` subcommands.

Every evaluation prints a rich table for people and, with ``--json``, the same
figures as one JSON object on the last line for scripts (the benchmark convention).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer

__all__ = ["JsonFlag", "print_figures", "print_json_line", "progress_bar", "progress_steps"]

JsonFlag = Annotated[bool, typer.Option("--json", help="Last line: the headline figures as JSON")]
"""The ``--json`` option every evaluation subcommand takes (typer copies the option per command)."""


def progress_bar() -> Any:
    """A transient rich progress bar (rich is imported lazily: only the CLI needs it)."""
    from rich.progress import Progress

    return Progress(transient=True)


@contextmanager
def progress_steps(label: str, total: int, show: bool) -> Iterator[Callable[[], None]]:
    """Yield a ``step()`` callback that advances a ``total``-step bar (a no-op when not ``show``)."""
    if not show:
        yield lambda: None
        return
    with progress_bar() as bar:
        task = bar.add_task(label, total=total)
        yield lambda: bar.advance(task)


def print_figures(title: str, result: dict[str, Any]) -> None:
    """A two-column rich table, one row per figure in ``result``, in its order."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in result.items():
        table.add_row(key, str(value))
    Console().print(table)


def print_json_line(result: dict[str, Any]) -> None:
    """Print ``result`` as one JSON line, non-ASCII text kept readable."""
    print(json.dumps(result, ensure_ascii=False))
