"""context-mode's memory as an MCP server: ``contextmode mcp`` (stdio, or streamable HTTP).

Any MCP client (a desktop assistant, an IDE, an agent framework) gets six tools
over one session store:

- ``remember``: store a turn the client already has (no model call; summaries,
  pins and recall see it like a live turn),
- ``get_context``: exactly what a model would receive for a message, per layer with tokens,
- ``search_memory``: the session's turns that best match a query (recall's ranking),
- ``list_pins`` / ``remove_pin``: the pinned constraints, and removing one by key,
- ``get_trace``: what the model received at a past turn (``contextmode inspect --turn``).

The tools call `MemoryTools`, a small typed facade over the public `ContextMode`
API (``arecord``, ``aprepare``) and, where it has no method, the store and engine
functions the HTTP service uses (constraints, `Recaller.recall`, `Engine.trace`).
Built on the official ``mcp`` SDK (``mcp.server.mcpserver.MCPServer``; the ``mcp`` extra)::

    from contextmode.integrations.mcp_server import build_server
    build_server().run()                      # stdio, on the embedded defaults

Over HTTP (``contextmode mcp --http``) the server takes the HTTP service's API keys
(``CONTEXTMODE_API_KEYS`` / ``CONTEXTMODE_API_KEYS_FILE``): when any is configured, every
request needs a key of the served tenant (`http_app`). stdio needs none: the client started it.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field
from starlette.types import ASGIApp, Receive, Scope, Send

from ..api import ContextMode
from ..errors import ConflictError, ContextModeError, MissingExtra
from ..memory.recall import Recaller
from ..service.auth import ApiKeys
from ..service.codes import Unauthorized, code_for_exception, public_message
from ..service.responses import exception_response
from ..service.schemas import ConstraintOut, ContextOut
from ..store.records import trace_to_dict
from ..types import SessionKey, validate_id

try:
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
except ImportError as exc:  # pragma: no cover - the extra is installed wherever this is tested
    raise MissingExtra("mcp", exc.name or "mcp") from exc

__all__ = ["MemoryTools", "RecalledOut", "RememberedOut", "RemovedPinOut", "build_server", "http_app", "serve"]

Transport = Literal["stdio", "streamable-http"]
_PIN_RETRIES = 3
"""Compare-and-set attempts when removing a pin races a background constraint job."""


class RememberedOut(BaseModel):
    """The stored turn."""

    session_id: str
    seq: int = Field(description="The turn's sequence number in the session.")
    turn: int | None = Field(description="Exchange number: the session's n-th user message.")
    role: str
    tokens: int


class RecalledOut(BaseModel):
    """One turn found by ``search_memory``."""

    seq: int
    role: str
    content: str
    score: float = Field(description="Ranking score (BM25; a neighbour gets its hit's score × 0.5).")
    neighbour_of: int | None = Field(default=None, description="Set when it came in as the turn before hit seq (or the answer after it).")


class RemovedPinOut(BaseModel):
    removed: bool = Field(description="False when no pin had that key.")
    pins: list[ConstraintOut] = Field(description="The pins left.")


class MemoryTools:
    """What the MCP tools do, typed: one `ContextMode` and its engine's store."""

    def __init__(self, memory: ContextMode) -> None:
        self.memory = memory
        self._recaller = memory.engine.recaller if isinstance(memory.engine.recaller, Recaller) else Recaller()

    @property
    def tenant(self) -> str:
        return self.memory.tenant

    def _key(self, session_id: str) -> SessionKey:
        """The session's key in this server's tenant (the tool argument checked here, once)."""
        return SessionKey(self.tenant, session_id)

    async def remember(
        self, session_id: str, role: Literal["user", "assistant"], content: str, *, user_id: str | None = None
    ) -> RememberedOut:
        turn = await self.memory.arecord(validate_id(session_id), role, content, user_id=user_id)
        return RememberedOut(session_id=session_id, seq=turn.seq, turn=turn.metadata.get("turn"), role=turn.role,
                             tokens=turn.tokens)

    async def context(self, session_id: str, message: str) -> ContextOut:
        await self.memory.engine.drain()  # summaries and pins of the turns just remembered
        return ContextOut.of(await self.memory.aprepare(validate_id(session_id), message), full=True)

    async def search(self, session_id: str, query: str, *, limit: int = 5) -> list[RecalledOut]:
        engine = self.memory.engine
        state = await engine.store.load(self._key(session_id), recent=0)
        # An explicit query: no terms borrowed from the newest turns (turns=()), and the newest
        # turns are searched too (recent_turns=0: no recent window to leave them to).
        state = replace(state, turns=())
        found = await self._recaller.recall(engine.store, state, query, recent_turns=0, limit=limit)
        out: list[RecalledOut] = []
        for turn in found:
            if turn.notice:
                continue
            reason = turn.metadata.get("recall") or {}
            out.append(RecalledOut(seq=turn.seq, role=turn.role, content=turn.content,
                                   score=float(reason.get("score", 0.0)), neighbour_of=reason.get("neighbour_of")))
        return out

    async def pins(self, session_id: str) -> list[ConstraintOut]:
        await self.memory.engine.drain()  # the constraint jobs of the last turns
        state = await self.memory.engine.store.load(self._key(session_id), recent=0)
        return [ConstraintOut.of(c) for c in state.constraints]

    async def remove_pin(self, session_id: str, key: str) -> RemovedPinOut:
        engine = self.memory.engine
        await engine.drain()  # a job still running could otherwise write the pin back
        session = self._key(session_id)
        for _ in range(_PIN_RETRIES):
            state = await engine.store.load(session, recent=0)
            kept = [c for c in state.constraints if c.key != key]
            if len(kept) == len(state.constraints):
                return RemovedPinOut(removed=False, pins=[ConstraintOut.of(c) for c in kept])
            if await engine.store.commit_constraints(
                session, kept, expected_version=state.constraints_version
            ):
                return RemovedPinOut(removed=True, pins=[ConstraintOut.of(c) for c in kept])
        raise ConflictError(f"the pins of session {session_id!r} kept changing; try again")

    async def trace(self, session_id: str, turn: int) -> dict[str, Any]:
        trace = await self.memory.engine.trace(self._key(session_id), turn)
        return trace_to_dict(trace)


@contextlib.contextmanager
def _tool_errors() -> Iterator[None]:
    """A context-mode error as the tool's error result (its public message, as the HTTP API says it)."""
    try:
        yield
    except ContextModeError as exc:
        raise ToolError(public_message(exc, code_for_exception(exc))) from exc


SessionArg = Annotated[str, Field(description="Session id: 1-128 characters from A-Z a-z 0-9 . _ : -")]


def build_server(memory: ContextMode | None = None, *, name: str = "context-mode") -> MCPServer:
    """An `MCPServer` with the memory tools over ``memory`` (default: `ContextMode()` on the
    configured or embedded defaults)."""
    tools = MemoryTools(memory or ContextMode())
    server = MCPServer(name, instructions=(
        "Long-term memory for a conversation: remember each turn, then ask get_context for what a model "
        "should see for the next message (summary, pinned constraints, recalled turns, recent turns) "
        "within its token budget."
    ))

    @server.tool()
    async def remember(
        session_id: SessionArg,
        role: Annotated[Literal["user", "assistant"], Field(description="Who said it.")],
        content: Annotated[str, Field(description="The message text.")],
        user_id: Annotated[str | None, Field(description="The user the session belongs to (optional).")] = None,
    ) -> RememberedOut:
        """Store one turn of the conversation (no model is called); summaries, pinned constraints
        and recall are derived from it like from a live turn."""
        with _tool_errors():
            return await tools.remember(session_id, role, content, user_id=user_id)

    @server.tool()
    async def get_context(
        session_id: SessionArg, message: Annotated[str, Field(description="The next user message.")]
    ) -> ContextOut:
        """Exactly what a model would receive for the next message, within the token budget: the
        messages, and per layer (summary, pins, recall, recent turns) the tokens used and dropped."""
        with _tool_errors():
            return await tools.context(session_id, message)

    @server.tool()
    async def search_memory(
        session_id: SessionArg,
        query: Annotated[str, Field(description="What to look for.")],
        limit: Annotated[int, Field(ge=1, le=50, description="At most this many turns.")] = 5,
    ) -> list[RecalledOut]:
        """The session's stored turns that best match the query, best first."""
        with _tool_errors():
            return await tools.search(session_id, query, limit=limit)

    @server.tool()
    async def list_pins(session_id: SessionArg) -> list[ConstraintOut]:
        """The constraints and facts pinned near the top of every prompt (dietary rules, budget,
        names), with the turn each came from."""
        with _tool_errors():
            return await tools.pins(session_id)

    @server.tool()
    async def remove_pin(
        session_id: SessionArg, key: Annotated[str, Field(description="The pin's key, as list_pins shows it.")]
    ) -> RemovedPinOut:
        """Unpin a constraint by key (the turn it came from stays in the history)."""
        with _tool_errors():
            return await tools.remove_pin(session_id, key)

    @server.tool()
    async def get_trace(
        session_id: SessionArg,
        turn: Annotated[int, Field(ge=1, description="Exchange number: 1 = the session's first user message.")],
    ) -> dict[str, Any]:
        """What the model received at a past live turn: messages, layers, pins and recalled turns used."""
        with _tool_errors():
            return await tools.trace(session_id, turn)

    return server


async def serve(
    server: MCPServer, memory: ContextMode, *, transport: Transport = "stdio",
    host: str = "127.0.0.1", port: int = 8765, path: str = "/mcp", api_keys: Mapping[str, str] | None = None,
) -> None:
    """Serve ``server`` until stopped, then close ``memory`` (its background jobs finish first).

    Over HTTP, ``api_keys`` (key → tenant; default: the HTTP service's, ``CONTEXTMODE_API_KEYS``
    and ``CONTEXTMODE_API_KEYS_FILE``) are required as the service requires them (`http_app`).
    """
    try:
        if transport == "stdio":
            await server.run_stdio_async()
        else:
            app = http_app(server, memory, host=host, path=path, api_keys=api_keys)
            await _http_server(app, host, port).serve()
    finally:
        await memory.aclose()


def http_app(
    server: MCPServer, memory: ContextMode, *, host: str = "127.0.0.1", path: str = "/mcp",
    api_keys: Mapping[str, str] | None = None,
) -> ASGIApp:
    """The streamable-HTTP app of ``server``. With API keys configured (``api_keys``, default
    the HTTP service's from the environment) every request needs one, sent as the service takes
    it (``Authorization: Bearer <key>`` or ``X-API-Key: <key>``), and of ``memory``'s tenant:
    else 401 with the service's error envelope (40101). No key configured: no authentication."""
    from ..service.settings import api_keys_from_env

    app: ASGIApp = server.streamable_http_app(streamable_http_path=path, host=host)
    keys = ApiKeys(api_keys_from_env() if api_keys is None else api_keys)
    if not keys.enabled:
        return app
    tenant = memory.tenant

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            try:
                if keys.tenant_for_headers(scope.get("headers", ())) != tenant:
                    raise Unauthorized("this API key is not for the tenant this MCP server serves")
            except Unauthorized as exc:
                await exception_response(scope.get("path", ""), exc)(scope, receive, send)
                return
        await app(scope, receive, send)

    return guarded


def _http_server(app: Any, host: str, port: int) -> Any:
    """uvicorn for the streamable-HTTP app; SIGINT and SIGTERM stop it gracefully.

    (uvicorn re-raises a caught signal once it has shut down, which would end the process
    before the memory is closed and its background jobs finish.)
    """
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self.handle_exit, sig, None)
            try:
                yield
            finally:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(sig)

    return Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
