"""Shared console output for the ``contextmode eval`` subcommands.

Every evaluation prints a rich table for people and, with ``--json``, the same
figures as one JSON object on the last line for scripts (the benchmark convention).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = [
    "TRAINING_FILES",
    "JsonFlag",
    "Steps",
    "in_sample",
    "print_figures",
    "print_json_line",
    "print_table",
    "progress_bar",
    "progress_steps",
]

JsonFlag = Annotated[bool, typer.Option("--json", help="Last line: the headline figures as JSON")]
"""The ``--json`` option every evaluation subcommand takes (typer copies the option per command)."""


TRAINING_FILES: dict[str, dict[str, str]] = {
    "detector": {
        "restoration200k/valid.txt": "190b1d0cc5a72fc2a6c1ce32",
        "canard/dev.json": "fafd9f53be0684fd33f85f6b",
    },
    "fact_scorer": {
        "msc/personasummary_s1_valid.txt": "b2367fa1d25995c35cd4b86d",
        "msc/personasummary_s2_valid.txt": "33e44ed61007e82960eaf907",
        "msc/personasummary_s3_valid.txt": "4483b0f355882b85e23fcf53",
        "msc/personasummary_s4_valid.txt": "57b2afd44982b4c877d6776b",
    },
}
"""The files each shipped model was trained on (see the model files' ``trained_on``), with the
first 24 hex digits of their SHA-256, by which a renamed copy is recognised too."""


def in_sample(path: str | Path, model: str) -> bool:
    """True when ``path`` is a file the shipped ``model`` was trained on: same folder and
    name, or the same content (SHA-256)."""
    files = TRAINING_FILES.get(model, {})
    resolved = Path(path)
    if "/".join(resolved.parts[-2:]) in files:
        return True
    try:
        digest = hashlib.sha256(resolved.read_bytes()).hexdigest()[:24]
    except OSError:
        return False
    return digest in files.values()


def progress_bar() -> Any:
    """A transient rich progress bar on stderr, so stdout keeps only the results (rich is
    imported lazily: only the CLI needs it)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
        console=Console(stderr=True), transient=True,
    )


class Steps:
    """``step()`` advances the bar by one; ``describe(text)`` changes what it says it is doing."""

    def __init__(self, bar: Any = None, task: Any = None) -> None:
        self._bar, self._task = bar, task

    def __call__(self) -> None:
        if self._bar is not None:
            self._bar.advance(self._task)

    def describe(self, text: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, description=text)


@contextmanager
def progress_steps(label: str, total: int, show: bool) -> Iterator[Steps]:
    """Yield a `Steps` that advances a ``total``-step bar (does nothing when not ``show``)."""
    if not show:
        yield Steps()
        return
    with progress_bar() as bar:
        yield Steps(bar, bar.add_task(label, total=total))


def print_table(title: str, header: Sequence[str], rows: Iterable[Sequence[str]], *, left: int = 1) -> None:
    """A rich table: the first ``left`` columns left-aligned (names), the others right-aligned
    (figures); as wide as it needs when stdout is not a terminal (a log keeps every column)."""
    import sys

    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i < left else "right", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    Console(width=None if sys.stdout.isatty() else 200).print(table)


def print_figures(title: str, result: dict[str, Any]) -> None:
    """A two-column rich table, one row per figure in ``result``, in its order."""
    from rich.console import Console
    from rich.table import Table

    if result.get("in_sample"):
        title += " — IN SAMPLE: a shipped model was trained on this data"
    table = Table(title=title)
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in result.items():
        table.add_row(key, str(value))
    Console().print(table)


def print_json_line(result: dict[str, Any]) -> None:
    """Print ``result`` as one JSON line, non-ASCII text kept readable."""
    print(json.dumps(result, ensure_ascii=False))
