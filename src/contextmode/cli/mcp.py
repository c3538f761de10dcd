"""``contextmode mcp``: the memory tools over MCP (stdio by default, ``--http`` for streamable HTTP)."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    @app.command("mcp")
    def mcp(
        http: Annotated[bool, typer.Option("--http", help="Serve streamable HTTP at http://HOST:PORT/mcp instead of stdio (requires the service's API key when CONTEXTMODE_API_KEYS or _FILE is set).")] = False,
        host: Annotated[str, typer.Option(help="Bind address with --http.")] = "127.0.0.1",
        port: Annotated[int, typer.Option(help="Port with --http.")] = 8765,
        path: Annotated[str, typer.Option(help="Endpoint path with --http.")] = "/mcp",
        store: Annotated[str | None, typer.Option("--store", help="Store URL (default: CONTEXTMODE_STORE_URL or SQLite under CONTEXTMODE_HOME).")] = None,
        tenant: Annotated[str | None, typer.Option("--tenant", help="Tenant of the sessions (default: CONTEXTMODE_TENANT or local).")] = None,
    ) -> None:
        """Serve memory tools to MCP clients: remember, get_context, search_memory, list_pins,
        remove_pin, get_trace (needs the mcp extra)."""
        from ..api import ContextMode
        from ..integrations.mcp_server import build_server, serve

        memory = ContextMode(tenant=tenant, store=store)
        server = build_server(memory)
        asyncio.run(serve(server, memory, transport="streamable-http" if http else "stdio",
                          host=host, port=port, path=path))
