"""Shared console output for the ``contextmode eval`` subcommands.

Every evaluation prints a rich table for people and, with ``--json``, the same
figures as one JSON object on the last line for scripts (the benchmark convention).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = [
    "TRAINING_FILES",
    "JsonFlag",
    "in_sample",
    "print_figures",
    "print_json_line",
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
