"""Lifecycle commands: ``users``, ``forget``, ``export``, ``import``, ``migrate``, ``retention``."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..errors import ContextModeError, InputError
from ..lifecycle import forget, lifecycle_store, migrate, read_export, resume_forgets, write_export
from ..lifecycle.export import import_records, verify_export
from ..lifecycle.retention import RetentionSettings, enforce_retention
from ..session_keys import id_for_input
from ..store import open_store
from ..store.base import Store
from ..store.lifecycle import DeletionRecord, Scope
from ..types import validate_id

__all__ = ["register"]

err = Console(stderr=True)

StoreOpt = Annotated[str | None, typer.Option("--store", help="Store URL (default: CONTEXTMODE_STORE_URL or SQLite under CONTEXTMODE_HOME).")]


def _run(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    try:
        asyncio.run(body())
    except ContextModeError as exc:
        err.print(f"[red]{type(exc).__name__}: {exc}[/red]")
        raise typer.Exit(2) from None


@contextmanager
def _progress(label: str, total: int | None, quiet: bool) -> Iterator[Callable[[int], None]]:
    if quiet:
        yield lambda n: None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=False) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)


async def _count_turns(store: Store, tenants: list[str] | None) -> int:
    lifecycle = lifecycle_store(store)
    total = 0
    for tenant in tenants if tenants is not None else await lifecycle.list_tenants():
        offset = 0
        while True:
            page = await store.list_sessions(tenant, limit=500, offset=offset)
            total += sum(i.last_seq for i in page)
            if len(page) < 500:
                break
            offset += 500
    return total


def _record_json(record: DeletionRecord) -> dict[str, Any]:
    return {"deletion_id": record.id, "tenant": record.tenant, "scope": record.scope, "target": record.target,
            "started_at": record.started_at.isoformat(),
            "finished_at": record.finished_at.isoformat() if record.finished_at else None,
            "counts": dict(record.counts)}


def users(
    tenant: Annotated[str, typer.Option("--tenant", help="Tenant whose users to list.")] = "local",
    store: StoreOpt = None,
    limit: Annotated[int, typer.Option(help="At most this many users.")] = 100,
) -> None:
    """List a tenant's users (sessions that named one), most recently active first."""

    async def body() -> None:
        backend = open_store(store)
        try:
            for user in await lifecycle_store(backend).list_users(tenant, limit=limit):
                print(json.dumps({"user_id": user.user_id, "sessions": user.sessions,
                                  "updated_at": user.updated_at.isoformat()}))
        finally:
            await backend.close()

    _run(body)


def forget_command(
    user: Annotated[str | None, typer.Option("--user", help="Erase every session of this user (in --tenant, default local); an id or the key a framework adapter was given.")] = None,
    session: Annotated[str | None, typer.Option("--session", help="Erase this session (in --tenant, default local); an id or the key a framework adapter was given.")] = None,
    tenant: Annotated[str | None, typer.Option("--tenant", help="Alone: erase the whole tenant. With --user/--session: their tenant.")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Finish forgets a crash cut off.")] = False,
    yes: Annotated[bool, typer.Option("--yes", help="Needed to erase a whole tenant.")] = False,
    store: StoreOpt = None,
) -> None:
    """Erase a user, a session or a tenant with every derived record; print the counts (JSON)."""
    chosen = [name for name, value in (("--user", user), ("--session", session)) if value]
    if resume:
        scope: Scope | None = None
    elif len(chosen) > 1:
        raise typer.BadParameter("give one of --user, --session (or --tenant alone)")
    elif user:
        scope, target = "user", id_for_input(user)
    elif session:
        scope, target = "session", id_for_input(session)
    elif tenant:
        if not yes:
            raise typer.BadParameter(f"erasing all of tenant {tenant!r} needs --yes")
        scope, target = "tenant", tenant
    else:
        raise typer.BadParameter("name what to forget: --user ID, --session ID or --tenant ID (or --resume)")

    async def body() -> None:
        backend = open_store(store)
        try:
            if scope is None:
                records = await resume_forgets(backend)
            else:
                records = [await forget(backend, tenant or "local", scope, target, actor="cli")]
            for record in records:
                print(json.dumps(_record_json(record), ensure_ascii=False))
        finally:
            await backend.close()

    _run(body)


def export(
    output: Annotated[Path, typer.Argument(help="The JSONL file to write ('-': standard output).")],
    store: StoreOpt = None,
    tenant: Annotated[list[str] | None, typer.Option("--tenant", help="Only this tenant (repeatable; default all).")] = None,
    derived: Annotated[bool, typer.Option("--derived/--no-derived", help="Include summaries, pins and emotion scores.")] = True,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
) -> None:
    """Export every session (turns, and derived records unless --no-derived) as JSON lines."""

    async def body() -> None:
        backend = open_store(store)
        try:
            total = None if quiet else await _count_turns(backend, tenant)
            with _progress("export", total, quiet or str(output) == "-") as advance:
                footer = await write_export(backend, output, derived=derived, tenants=tenant, progress=advance)
            err.print(json.dumps(footer))
        finally:
            await backend.close()

    _run(body)


def import_command(
    source: Annotated[Path, typer.Argument(help="A file written by `contextmode export` ('-': standard input).")],
    store: StoreOpt = None,
    replace: Annotated[bool, typer.Option("--replace", help="Erase a session the store already holds, then import it.")] = False,
    as_id: Annotated[str | None, typer.Option("--as", help="Import the file's only session under this new id.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
) -> None:
    """Import an export file: the whole file is checked first (structure, every checksum), then each
    session is written whole or not at all. A session the store already holds is refused unless it is
    identical (then skipped), --replace is given, or --as NEW_ID imports it under another id."""
    if str(source) != "-" and not source.is_file():
        raise typer.BadParameter(f"no file {str(source)!r}")
    if replace and as_id is not None:
        raise typer.BadParameter("use either --replace or --as, not both")

    async def body() -> None:
        with _readable_twice(source) as path:
            plan = await verify_export(read_export(path))
            if as_id is not None:
                validate_id(as_id)
                if len(plan.sessions) != 1:
                    raise InputError(f"--as needs an export of one session; this one holds {len(plan.sessions)}")
            backend = open_store(store)
            try:
                with _progress("import", None, quiet) as advance:
                    report = await import_records(
                        backend, read_export(path), progress=advance, plan=plan, rename=as_id,
                        existing="replace" if replace else "refuse",
                    )
                print(json.dumps({"sessions": report.sessions, "turns": report.turns,
                                  "skipped_sessions": report.skipped_sessions}))
            finally:
                await backend.close()

    _run(body)


@contextmanager
def _readable_twice(source: Path) -> Iterator[Path]:
    """``source``, or standard input copied to a temporary file (an import reads it twice)."""
    if str(source) != "-":
        yield source
        return
    with tempfile.TemporaryDirectory(prefix="contextmode-import-") as folder:
        copy = Path(folder) / "export.jsonl"
        with copy.open("w", encoding="utf-8") as out:
            shutil.copyfileobj(sys.stdin, out)
        yield copy


def migrate_command(
    source: Annotated[str, typer.Option("--from", help="Source store URL.")],
    target: Annotated[str, typer.Option("--to", help="Target store URL.")],
    tenant: Annotated[list[str] | None, typer.Option("--tenant", help="Only this tenant (repeatable).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
) -> None:
    """Copy every session from one store to another, then verify counts and checksums. Resumable."""

    async def body() -> None:
        src, dst = open_store(source), open_store(target)
        try:
            total = await _count_turns(src, tenant)
            with _progress("migrate", total, quiet) as advance:
                report = await migrate(src, dst, tenants=tenant, progress=advance)
            summary = {
                "verified": report.verified, "sessions": report.source.sessions, "turns": report.source.turns,
                "copied_turns": report.imported.turns, "skipped_turns": report.imported.skipped_turns,
                "source_sha256": f"{report.source.digest:064x}", "target_sha256": f"{report.target.digest:064x}",
            }
            print(json.dumps(summary))
            if not report.verified:
                err.print("[red]the target does not hold the same sessions and turns as the source[/red]")
                raise typer.Exit(1)
        finally:
            await src.close()
            await dst.close()

    _run(body)


def retention(store: StoreOpt = None) -> None:
    """Apply the retention policies (CONTEXTMODE_RETENTION_*) once and print what was erased."""
    settings = RetentionSettings.from_env()
    if not settings.enabled:
        err.print("no retention policy is set (CONTEXTMODE_RETENTION_MAX_AGE_DAYS, _MAX_TURNS, "
                  "_MAX_SESSIONS_PER_USER or _FILE): nothing to do")
        return

    async def body() -> None:
        backend = open_store(store)
        try:
            print(json.dumps(await enforce_retention(backend, settings)))
        finally:
            await backend.close()

    _run(body)


def register(app: typer.Typer) -> None:
    """Add the lifecycle commands to the ``contextmode`` app."""
    app.command()(users)
    app.command("forget")(forget_command)
    app.command()(export)
    app.command("import")(import_command)
    app.command("migrate")(migrate_command)
    app.command()(retention)

