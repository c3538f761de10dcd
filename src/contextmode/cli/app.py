"""Typer application: one function per command, each a thin layer over the engine."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from ..api import build_engine
from ..engine import PreparedTurn, TurnRequest
from ..errors import ContextModeError, MissingExtra, UserError
from ..session_keys import id_for_input, key_for_id
from ..settings import EngineSettings
from ..types import SessionKey
from .render import Numbering, load_numbering, prepared_panel, trace_panel, trace_seqs, turns_table

__all__ = ["app", "main"]

app = typer.Typer(
    name="contextmode",
    help="context-mode: what an LLM chat model should see, inside a token budget. "
    "Installed as the distribution contextmode-engine (pip install contextmode-engine).",
    no_args_is_help=True,
    add_completion=False,
)
eval_app = typer.Typer(help="Measure the language layer and recall on public datasets.", no_args_is_help=True)
app.add_typer(eval_app, name="eval")
console = Console()
_debug = False
"""``--debug``: let errors show their traceback."""


@app.callback()
def _options(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors (default: one line).")] = False,
) -> None:
    global _debug
    _debug = debug

for _module in ("followup", "rewrite", "summary", "constraints", "emotion", "locomo", "pii"):
    try:
        importlib.import_module(f"contextmode.evaluation.{_module}").register(eval_app)
    except ModuleNotFoundError as exc:  # pragma: no cover - a module still being written
        if exc.name != f"contextmode.evaluation.{_module}":
            raise


importlib.import_module("contextmode.cli.index").register(app)
importlib.import_module("contextmode.cli.mcp").register(app)
importlib.import_module("contextmode.cli.stats").register(app)
from .lifecycle import register as _register_lifecycle  # noqa: E402 - after the eval sub-app

_register_lifecycle(app)

StoreOpt = Annotated[str | None, typer.Option("--store", help="Store URL (default: CONTEXTMODE_STORE_URL or SQLite under CONTEXTMODE_HOME).")]
TenantOpt = Annotated[str, typer.Option("--tenant", help="Tenant of the session.")]


@app.command()
def demo(
    store: Annotated[str | None, typer.Option("--store", help="Store URL to keep the demo in (default: a temporary in-memory store; your data is never touched).")] = None,
    session: Annotated[str, typer.Option("--session", "-s", help="Session id of the demo (refused if it already exists in --store).")] = "demo",
    window: Annotated[int, typer.Option(help="Context window in tokens (small, so summaries show).")] = 700,
    messages: Annotated[bool, typer.Option(help="Also print the messages sent.")] = False,
) -> None:
    """Replay a sample Chinese conversation and show, per turn, what the model receives."""
    from .demo import run_demo

    asyncio.run(run_demo(console, store=store, session=session, window=window, show_messages=messages))


_SERVICE_MODULES = ("fastapi", "uvicorn", "prometheus_client", "httpx")
"""What ``contextmode serve`` imports from the ``service`` extra."""


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (default 127.0.0.1, CONTEXTMODE_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default 8000, CONTEXTMODE_PORT).")] = None,
    workers: Annotated[int, typer.Option(help="uvicorn worker processes.")] = 1,
) -> None:
    """Run the HTTP service (SSE chat, OpenAI-compatible proxy, inspector page)."""
    # Checked before anything starts: uvicorn alone installed would import the app in its
    # own process and die there with a long traceback.
    for module in _SERVICE_MODULES:
        if importlib.util.find_spec(module) is None:
            raise MissingExtra("service", module)
    import uvicorn

    from ..service.settings import ServiceSettings

    settings = ServiceSettings.from_env()
    _check_settings()
    uvicorn.run(
        "contextmode.service.app:create_app",
        factory=True,
        host=host or settings.host,
        port=port or settings.port,
        workers=workers,
        log_level="info",
        # Longer than a reverse proxy's upstream keep-alive (nginx: 60 s), so the proxy never
        # sends a request on a connection uvicorn is closing (a 502 on POSTs).
        timeout_keep_alive=75,
    )


@app.command()
def chat(
    session: Annotated[str, typer.Option("--session", "-s", help="Session id.")] = "cli",
    store: StoreOpt = None,
    tenant: TenantOpt = "local",
) -> None:
    """Chat in the terminal, with /context, /summary, /constraints, /reset, /session."""
    from .chat import run_chat

    asyncio.run(run_chat(console, key=SessionKey(tenant, session), store=store))


@app.command()
def inspect(
    session: Annotated[str, typer.Argument(help="Session id, or the key a framework adapter was given.")],
    message: Annotated[str, typer.Option("--message", "-m", help="A next message to build the context for.")] = "…",
    store: StoreOpt = None,
    tenant: TenantOpt = "local",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    turn: Annotated[int | None, typer.Option("--turn", "-t", min=1, help="Show what the model received at this past turn (n = the n-th user message); --json prints the same data as GET /v1/sessions/{id}/turns/{n}/context.")] = None,
) -> None:
    """Show a stored session: its turns, summary, constraints and the layers of the next context,
    or with --turn N exactly what the model received at turn N."""

    key = SessionKey(tenant, id_for_input(session))

    async def run() -> None:
        engine = build_engine(store=store)
        try:
            if turn is not None:
                from ..store.records import trace_to_dict

                trace = await engine.trace(key, turn)
                if as_json:
                    print(json.dumps(trace_to_dict(trace), ensure_ascii=False))
                else:
                    numbering = await load_numbering(engine.store, key, trace_seqs(trace))
                    console.print(trace_panel(trace, numbering))
                return
            info = await engine.store.info(key)
            if info is None:
                console.print(f"[red]no session {session!r} for tenant {tenant!r}[/red]")
                raise typer.Exit(1)
            state = await engine.store.load(key, recent=20)
            prepared = await engine.prepare(TurnRequest(key=key, message=message))
            if as_json:
                print(json.dumps({
                    "session": key_for_id(key.session_id), "last_seq": info.last_seq,
                    "summary": state.summary.text if state.summary else None,
                    "summary_covers_seq": state.summary_covers_seq,
                    "constraints": [{"value": c.value, "key": c.key, "source_seq": c.source_seq} for c in state.constraints],
                    "layers": {n: {"allocated": a.allocated, "used": a.used, "dropped": list(a.dropped_seqs)}
                               for n, a in prepared.context.accounts.items()},
                    "total_tokens": prepared.context.total_tokens,
                    "recalled": _recall_reasons(prepared),
                    "jobs": {k: {"ok": v.ok, "failed": v.failed, "last_error": v.last_error} for k, v in info.jobs.items()},
                }, ensure_ascii=False))
                return
            console.print(turns_table(state.turns, state.constraints))
            if state.summary:
                covers = await load_numbering(engine.store, key, [state.summary.covers_seq])
                console.print(f"[cyan]summary ({covers.through(state.summary.covers_seq)}, v{state.summary.version}):[/cyan] {state.summary.text}")
            for name, stats in info.jobs.items():
                console.print(f"job {name}: ok {stats.ok}, failed {stats.failed}" + (f", last error: {stats.last_error}" if stats.last_error else ""))
            console.print(prepared_panel(prepared))
            numbering = Numbering(prepared.state.recalled)
            for reason in _recall_reasons(prepared):
                neighbour = reason["neighbour_of"]
                console.print(
                    f"recalled {numbering.label(reason['seq'])}: score {reason['score']}, matched "
                    f"{', '.join(reason['matched']) or '—'}"
                    + (f" ({_neighbour_side(reason['seq'], neighbour)} {numbering.label(neighbour)})"
                       if neighbour else "")
                )
        finally:
            await engine.close()

    asyncio.run(run())


def _neighbour_side(seq: int, hit: int) -> str:
    """How a recalled neighbour relates to its hit: the turn before it, or the answer after it."""
    return "the turn before" if seq < hit else "the answer after"


def _recall_reasons(prepared: PreparedTurn) -> list[dict[str, Any]]:
    """Why each turn shown in the recall layer was recalled (score, matched terms), as the
    turn's trace keeps it (`trace.recalled_turns`: the query recall was given)."""
    from ..engine.trace import recalled_turns

    return [
        {"seq": r.seq, "score": r.score, "matched": list(r.matched), "neighbour_of": r.neighbour_of, "ranker": r.ranker}
        for r in recalled_turns(prepared) if r.layer == "recall"
    ]


@app.command()
def replay(
    file: Annotated[Path, typer.Argument(help="A JSONL file: one {\"role\", \"content\"} per line (or {\"user\", \"assistant\"}).", exists=True, dir_okay=False)],
    session: Annotated[str | None, typer.Option("--session", "-s", help="Session id (default: the file's stem).")] = None,
    store: StoreOpt = "memory://",
    strategy: Annotated[str | None, typer.Option(help="Memory strategy.")] = None,
    window: Annotated[int | None, typer.Option(help="Context window, tokens.")] = None,
    quiet: Annotated[bool, typer.Option(help="Only the final summary line per turn.")] = False,
) -> None:
    """Feed a recorded conversation and print, per turn, what the model would receive."""
    from .replay import run_replay

    settings = EngineSettings.from_env()
    if strategy or window:
        from dataclasses import replace

        settings = replace(settings, strategy=strategy or settings.strategy, context_window=window or settings.context_window)
    asyncio.run(run_replay(console, file, session=session or file.stem, store=store, settings=settings, quiet=quiet))


def _check_settings() -> None:
    """Read every setting the service will read, so a bad one fails here in one line."""
    from ..models.factory import model_from_env
    from ..store import open_store

    EngineSettings.from_env()
    model_from_env()
    asyncio.run(open_store().close())  # parses the URL; connects lazily, so nothing is opened


def _one_line(exc: ContextModeError) -> str:
    text = " ".join(str(exc).split())
    return f"error: {text}" if text else f"error: {type(exc).__name__}"


def main() -> None:
    """Entry point of the ``contextmode`` script.

    A configuration or usage error (`UserError`) prints one line and exits 2; any other
    context-mode error prints one line and exits 1; ``--debug`` shows the traceback instead.
    """
    try:
        app()
    except ContextModeError as exc:
        if _debug or "--debug" in sys.argv[1:]:
            raise
        print(_one_line(exc), file=sys.stderr)
        raise SystemExit(2 if isinstance(exc, UserError) else 1) from None
