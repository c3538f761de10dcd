"""One context-mode session seen by a framework adapter (LangChain, LlamaIndex).

The frameworks call their memory from sync code, from async code, and from threads
with their own loops; every call here runs on the `ContextMode`'s private loop
thread (`ContextMode.submit`), so the store's connections only ever see one loop.

A framework hands its memory the user's new message before it asks for the model's
input; context-mode assembles the context *for* a message (detection, rewrite, recall)
before storing it. `SessionMemory.context_for` does both in that order, so the model
receives exactly what `ContextMode.acontext` gives for the message, and the message is
stored right after.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, TypeVar

from ..api import ContextMode, MessageRecord
from ..assembly import Context, to_messages
from ..assembly.render import DATA_LAYERS, SECTION_SEPARATOR, rewrite_hint
from ..session_keys import id_for_key
from ..settings import EngineSettings
from ..types import ChatMessage, Turn

__all__ = ["NO_SYSTEM_PROMPT", "SessionMemory", "default_memory", "memory_messages", "memory_sections"]

NO_SYSTEM_PROMPT = ""
"""The system prompt the adapters assemble with: none. The application's own (set in its
framework) stays the only persona; the engine's default never reaches the model through an
adapter, and its tokens go to memory instead."""


def memory_sections(context: Context) -> list[str]:
    """What of ``context`` is memory, each section as rendered: the rewrite hint (when one is
    shown), then the pins, summary, key moments and recall in the context's order. Never the
    engine's system prompt nor its reply format, however ``context`` was assembled."""
    hint = [rewrite_hint(context.hint, context.locale)] if context.hint else []
    return hint + [layer.rendered for layer in context.layers if layer.name in DATA_LAYERS and layer.rendered]


def memory_messages(context: Context) -> list[ChatMessage]:
    """`to_messages` with memory only: one system message holding `memory_sections` (none when
    no layer holds anything), then the recent turns, the current message and its tool step."""
    chat = to_messages(context)
    if chat and chat[0].role == "system":
        chat = chat[1:]
    sections = memory_sections(context)
    head = [ChatMessage(role="system", content=SECTION_SEPARATOR.join(sections))] if sections else []
    return head + chat

T = TypeVar("T")

_shared: dict[int | None, ContextMode] = {}
_shared_lock = threading.Lock()


def default_memory(budget: int | None = None) -> ContextMode:
    """The process's `ContextMode` on the embedded defaults (one per ``budget``): adapters
    built per request (``RunnableWithMessageHistory`` makes a history per call) share it
    instead of opening a store and a loop thread each.

    ``budget``: input tokens of the assembled context (``context_window = budget``,
    ``reply_reserve = 0``); default the configured window.
    """
    with _shared_lock:
        memory = _shared.get(budget)
        if memory is None:
            settings = EngineSettings.from_env()
            if budget is not None:
                settings = replace(settings, context_window=budget, reply_reserve=0)
            memory = _shared[budget] = ContextMode(settings=settings)
        return memory


class SessionMemory:
    """A session of a `ContextMode`, callable from sync and async code alike."""

    def __init__(self, key: str, *, memory: ContextMode | None, budget: int | None, user_id: str | None) -> None:
        self.key = key
        """The session's key as the framework gave it (any string)."""
        self.session_id = id_for_key(key)
        """The id it is stored under (`id_for_key`: the key itself when it is a valid id)."""
        self.memory = memory if memory is not None else default_memory(budget)
        self.user_id = id_for_key(user_id) if user_id is not None else None
        self.last_context: Context | None = None
        """The context assembled last, per layer with tokens (what the model was given)."""

    # -- plumbing ---------------------------------------------------------

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` run on the memory's loop thread."""
        return await asyncio.wrap_future(self.memory.submit(coro))

    def wait(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the memory's loop thread and block until it is done."""
        return self.memory.submit(coro).result()

    # -- the session --------------------------------------------------------

    async def record(self, records: Sequence[MessageRecord]) -> list[Turn]:
        """Store ``records`` in order (nothing for an empty list)."""
        if not records:
            return []
        return await self.memory.arecord_messages(self.session_id, records, user_id=self.user_id)

    async def turns(self) -> list[Turn]:
        """Every stored turn, oldest first."""
        return await self.memory.aturns(self.session_id)

    async def clear(self) -> None:
        """Erase the session (its turns and everything derived from them)."""
        await self.memory.aforget(session_id=self.session_id)

    async def context_for(
        self, message: str, record: MessageRecord | None, *, now: datetime | None = None
    ) -> Context:
        """The context for a new user ``message`` (asked at ``now``, default now); then store
        ``record`` (the message)."""
        context = await self.memory.acontext(self.session_id, message, system_prompt=NO_SYSTEM_PROMPT, now=now)
        if record is not None:
            await self.record([record])
        self.last_context = context
        return context

    async def context_to_continue(self) -> Context:
        """The context to continue the stored session: its latest user turn and everything
        after it (tool calls and results) whole, the earlier turns through the layers."""
        context = await self.memory.acontinue(self.session_id, system_prompt=NO_SYSTEM_PROMPT)
        self.last_context = context
        return context
