"""``contextmode chat``: an interactive REPL with streamed answers and inspection commands."""

from __future__ import annotations

import asyncio
import contextlib

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..api import build_engine
from ..engine import Engine, TurnRequest
from ..errors import ContextModeError
from ..models.offline import OfflineResponder
from ..types import SessionKey
from .render import load_numbering, prepared_panel, turns_table

__all__ = ["HELP", "help_table", "run_chat"]

HELP: tuple[tuple[str, str], ...] = (
    ("/context [message]", "the layers the next message would get (with token bars)"),
    ("/summary", "the committed summary and what it covers"),
    ("/constraints", "pinned constraints with the turn they came from"),
    ("/history", "the newest stored turns"),
    ("/reset", "delete this session (turns and derived records)"),
    ("/session [id]", "show or switch the session"),
    ("/help", "this list"),
    ("/quit", "leave (or Ctrl+D); Ctrl+L clears the screen"),
)
"""The chat's commands and what each does."""


def help_table() -> Table:
    """`HELP` in two aligned columns (a table: "[message]" is never read as markup)."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    for command, what in HELP:
        table.add_row(Text(command), Text(what))
    return table


def _line_editing() -> None:
    """Line editing for the prompt: history with the arrows, Ctrl+L clears the screen
    (without it the terminal echoes ``^L``). Where Python has no readline, nothing."""
    with contextlib.suppress(ImportError):  # Windows
        import readline  # noqa: F401 - importing it is what turns line editing on


async def run_chat(console: Console, *, key: SessionKey, store: str | None) -> None:
    engine = build_engine(store=store)
    _line_editing()
    console.print(
        f"context-mode chat · session [bold]{key.session_id}[/bold] · model {engine.model.name} · "
        f"tokens {engine.counter.name}{'' if engine.counter.exact else ' (estimate)'} · /help for commands"
    )
    loop = asyncio.get_running_loop()
    try:
        while True:
            try:
                line = await loop.run_in_executor(None, lambda: console.input("[bold green]你> [/bold green]"))
            except (EOFError, KeyboardInterrupt):
                break
            line = line.strip()
            if not line:
                continue
            if line.startswith("/"):
                command, _, arg = line.partition(" ")
                if command in ("/quit", "/exit"):
                    break
                key = await _command(console, engine, key, command, arg.strip())
                continue
            printed = False
            try:
                # The offline responder's text is an engine notice, not an answer: say so.
                notice = isinstance(engine.model, OfflineResponder)
                console.print("[bold yellow]通知 (notice)>[/bold yellow] " if notice else "[bold]助手>[/bold] ", end="")
                async for event in engine.stream(TurnRequest(key=key, message=line)):
                    if event.kind == "delta":
                        printed = printed or bool(event.text)
                        console.print(event.text, end="", markup=False, highlight=False)
                    elif event.kind == "done":
                        flag = " (partial)" if event.result.partial else ""
                        console.print(f"\n[bright_black]{event.result.prepared.context.summary_line()}{flag}[/bright_black]")
                    elif event.kind == "failed":
                        raise event.error
            except ContextModeError as exc:
                if printed:  # the engine stored the text shown so far as a partial answer
                    console.print("\n[yellow](interrupted: the partial answer above was kept)[/yellow]", end="")
                console.print(f"\n[red]{type(exc).__name__}: {exc}[/red]")
    finally:
        await engine.close()


async def _command(console: Console, engine: Engine, key: SessionKey, command: str, arg: str) -> SessionKey:
    if command in ("/summary", "/constraints", "/history", "/context"):
        await engine.drain()  # show what the background jobs of the last turn produced
    if command == "/help":
        console.print(help_table())
    elif command == "/context":
        try:
            console.print(prepared_panel(await engine.prepare(TurnRequest(key=key, message=arg or "…")), show_messages=True))
        except ContextModeError as exc:
            console.print(f"[red]{type(exc).__name__}: {exc}[/red]")
    elif command == "/summary":
        state = await engine.store.load(key, recent=0)
        if state.summary:
            covers = await load_numbering(engine.store, key, [state.summary.covers_seq])
            console.print(f"[cyan]{covers.through(state.summary.covers_seq)} (v{state.summary.version}):[/cyan] {state.summary.text}")
        else:
            console.print("no summary yet")
    elif command == "/constraints":
        state = await engine.store.load(key, recent=0)
        numbering = await load_numbering(engine.store, key, [c.source_seq for c in state.constraints])
        for c in state.constraints:
            console.print(f"📌 {c.value}  [bright_black]({numbering.label(c.source_seq)}, {c.kind}, key {c.key})[/bright_black]")
        if not state.constraints:
            console.print("no pinned constraints")
    elif command == "/history":
        state = await engine.store.load(key, recent=12)
        console.print(turns_table(state.turns, state.constraints))
    elif command == "/reset":
        await engine.drain()
        deleted = await engine.store.delete(key)
        console.print("session deleted" if deleted else "nothing stored yet")
    elif command == "/session":
        if arg:
            try:
                key = SessionKey(key.tenant, arg)
            except ContextModeError as exc:
                console.print(f"[red]{type(exc).__name__}: {exc}[/red]")
        console.print(f"session: {key.session_id}")
    else:
        console.print(f"unknown command {command}; /help lists them")
    return key
