"""OpenAI Agents SDK: `ContextModeSession`, a ``Session`` whose history is context-mode's memory.

```python
from agents import Agent, Runner
from contextmode.integrations.openai_agents import ContextModeSession

session = ContextModeSession("user-42")        # SQLite under CONTEXTMODE_HOME, like SQLiteSession
result = Runner.run_sync(Agent(name="Assistant"), "I'm vegetarian, remember that", session=session)
```

Every item the SDK stores (messages, ``function_call`` / ``function_call_output`` pairs,
reasoning, any other item) is kept verbatim and comes back equal and in order
(``get_items(limit)``: the latest ``limit`` items, oldest first; ``pop_item``: the newest).
Underneath, each item is a turn of context-mode's log: a user or assistant message, an
assistant turn carrying its tool calls, a ``tool`` turn answering one call id, so summaries,
pins, recall and the budget treat agent items as they do in the library (docs/agents.md).

While the whole history fits the input budget, ``get_items()`` returns it whole, as the SDK's
own sessions do. Beyond it, ``get_items()`` returns the assembled context: one ``system`` item
per memory layer (pins, summary, key moments, recall: reference data, never instructions),
then the recent items verbatim, then the latest user message and everything after it. A
call is never separated from its output (the assembler keeps them as one unit; an older
result too big for its tool's limit comes back with its ``output`` cut to the assembler's
excerpt). `context_items` gives the same for a message about to be sent.

All calls run on the `ContextMode` instance's own loop thread, so a session is safe under
``Runner.run_sync`` (another thread, its own loop) and under concurrent writers of this
process; ``add_items`` is one atomic append in any store, so batches never interleave.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar, Literal, TypeVar, cast

from agents.items import TResponseInputItem
from agents.memory.session_settings import (
    SessionSettings,
    coerce_session_settings,
    resolve_session_limit,
)
from agents.run_config import CallModelData, ModelInputData

from ..api import ContextMode, MessageRecord
from ..assembly import Context, LayerContent
from ..errors import InputError, MessageTooLarge
from ..memory.budget import Budget
from ..session_keys import id_for_key
from ..settings import EngineSettings
from ..tokens.tools import message_overhead
from ..types import ChatMessage, Role, ToolCall, Turn
from ._session import NO_SYSTEM_PROMPT, memory_sections

__all__ = ["ContextModeSession", "items_to_records", "turns_to_items"]

T = TypeVar("T")
Item = dict[str, Any]
_ITEMS = "agents_items"
"""Turn metadata key holding the SDK items a turn stands for."""
_TEXT_KEY = "_cm_text"
"""In a stored item: the key whose text is the turn's content (stored once, put back on read)."""
_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


def _text_of(content: object) -> str:
    """The text of a message's ``content`` or a tool output: a string, or its text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") in _TEXT_PARTS:
                texts.append(str(part.get("text") or part.get("refusal") or ""))
        return "\n".join(texts)
    return json.dumps(content, ensure_ascii=False, sort_keys=True)


def _kind(item: Mapping[str, Any]) -> Literal["user", "assistant", "call", "output", "other"]:
    kind = item.get("type")
    if kind in (None, "message") and "role" in item:
        return "assistant" if item["role"] == "assistant" else "user"
    if isinstance(kind, str) and "call_id" in item:
        if kind.endswith("_output"):
            return "output"
        if kind.endswith("_call"):
            return "call"
    return "other"


def _call_of(item: Mapping[str, Any]) -> ToolCall:
    name = item.get("name") or item.get("type", "tool")
    arguments = item.get("arguments")
    if not isinstance(arguments, str):
        rest = {k: v for k, v in item.items() if k not in ("type", "call_id", "id", "status", "name")}
        arguments = json.dumps(rest, ensure_ascii=False, sort_keys=True)
    return ToolCall(id=str(item["call_id"]), name=str(name), arguments=arguments)


def _stored(items: Sequence[Item], content: str) -> list[Item]:
    """The items as kept in the turn's metadata: a lone item's text is the turn's content,
    so it is not stored twice."""
    if len(items) == 1:
        item = items[0]
        for key in ("content", "output"):
            if isinstance(item.get(key), str) and item[key] == content:
                slim = {k: v for k, v in item.items() if k != key}
                slim[_TEXT_KEY] = key
                return [slim]
    return [dict(i) for i in items]


def _record(role: Role, content: str, items: Sequence[Item], calls: Sequence[ToolCall] = (),
            call_id: str | None = None) -> MessageRecord:
    return MessageRecord(
        message=ChatMessage(role=role, content=content, tool_calls=tuple(calls), tool_call_id=call_id),
        metadata={_ITEMS: _stored(items, content)},
    )


def items_to_records(items: Iterable[TResponseInputItem]) -> list[MessageRecord]:
    """SDK items as the turns that store them, in order: a user (or system/developer) message
    is a user turn; consecutive assistant-side items (messages, reasoning, calls) are one
    assistant turn carrying the calls; each call's output is a ``tool`` turn for its call id."""
    records: list[MessageRecord] = []
    group: list[Item] = []

    def flush() -> None:
        if group:
            text = "\n".join(t for t in (_text_of(i.get("content")) for i in group if _kind(i) == "assistant") if t)
            calls = [_call_of(i) for i in group if _kind(i) == "call"]
            records.append(_record("assistant", text, group, calls))
            group.clear()

    for raw in items:
        item = dict(cast(Mapping[str, Any], raw))
        kind = _kind(item)
        if kind in ("assistant", "call", "other"):
            group.append(item)
            continue
        flush()
        if kind == "user":
            records.append(_record("user", _text_of(item.get("content")), [item]))
        else:
            records.append(_record("tool", _text_of(item.get("output")), [item], call_id=str(item["call_id"])))
    flush()
    return records


def _items_of(turn: Turn) -> list[Item]:
    raw = turn.metadata.get(_ITEMS)
    if not isinstance(raw, list):
        # A turn stored by another entry point (chat, record, the proxy): its plain item.
        if turn.role == "tool":
            return [{"type": "function_call_output", "call_id": turn.tool_call_id or "", "output": turn.content}]
        calls = [{"type": "function_call", "call_id": c.id, "name": c.name, "arguments": c.arguments}
                 for c in turn.tool_calls]
        role = "user" if turn.role in ("user", "system") else "assistant"
        return ([{"role": role, "content": turn.content}] if turn.content or not calls else []) + calls
    out = []
    for stored in raw:
        item = dict(stored)
        key = item.pop(_TEXT_KEY, None)
        if isinstance(key, str):
            item[key] = turn.content
        out.append(item)
    return out


def turns_to_items(turns: Iterable[Turn]) -> list[TResponseInputItem]:
    """The SDK items the turns stand for, in order (exactly as they were added)."""
    return [cast(TResponseInputItem, item) for turn in turns for item in _items_of(turn)]


def _shown(turn: Turn, text: str, calls: tuple[ToolCall, ...]) -> list[Item]:
    """A turn's items as the assembler kept it: whole; a result cut to its excerpt; or a call
    turn whose results are missing as its messages only (never a call without its output)."""
    items = _items_of(turn)
    if turn.role == "tool" and text != turn.content:
        return [{**i, "output": text} if _kind(i) == "output" else i for i in items]
    if text != turn.content:  # as assembled: control strings broken, or only the newest part
        items = [{**i, "content": text} if i.get("content") == turn.content and _kind(i) in ("user", "assistant")
                 else i for i in items]
    if turn.tool_calls and not calls:
        return [i for i in items if _kind(i) == "assistant"]
    return items


def context_to_items(
    context: Context, turns: Mapping[int, Turn], latest_user: Turn | None, *, current: bool = True
) -> list[TResponseInputItem]:
    """An assembled context as SDK input items: a ``system`` item per memory layer, then the
    recent turns' items, then (``current``) the current message's (``latest_user`` when it is
    stored) and its step's."""
    out: list[Item] = [{"role": "system", "content": section} for section in memory_sections(context)]
    recent = context.layer("recent")
    step = context.layer("current") if current else None
    shown = list(recent.items if recent else ())
    if step is not None:
        if latest_user is not None:  # the stored message being continued: its own item
            shown.append(replace(step.items[0], seq=latest_user.seq, text=latest_user.content))
        shown.extend(step.items[1:])
    for item in shown:
        turn = turns.get(item.seq) if item.seq is not None else None
        if turn is not None:
            out.extend(_shown(turn, item.text, item.tool_calls))
    return [cast(TResponseInputItem, i) for i in out]


def _is_user(item: TResponseInputItem) -> bool:
    value = cast(Mapping[str, Any], item)
    return value.get("role") == "user" and value.get("type", "message") == "message"


_NO_ITEMS = LayerContent(name="recent", title="")


class ContextModeSession:
    """An OpenAI Agents SDK ``Session`` on context-mode's memory (module docstring).

    ``memory``: the `ContextMode` to use (default: one on the embedded defaults; share one
    between sessions). ``budget``: input tokens ``get_items()`` may return (default: the
    engine's input budget; given, it builds the default `ContextMode` with that window).
    ``user_id`` names the session's owner (`ContextMode.forget` erases by it).
    """

    _locks: ClassVar[weakref.WeakValueDictionary[tuple[int, str], asyncio.Lock]] = weakref.WeakValueDictionary()
    """One lock per (memory, session) while some call holds or awaits it: an idle lock is
    dropped (the map does not grow with every session ever seen), a lock in use is never replaced."""

    def __init__(
        self,
        session_id: str,
        *,
        memory: ContextMode | None = None,
        budget: int | None = None,
        user_id: str | None = None,
        session_settings: SessionSettings | Mapping[str, object] | None = None,
    ) -> None:
        if memory is None:
            settings = EngineSettings.from_env()
            if budget is not None:
                settings = replace(settings, context_window=budget, reply_reserve=0)
            memory = ContextMode(settings=settings)
        self.session_id = session_id
        """The session's key as given (any string: `id_for_key` maps it to the id it is stored under)."""
        self._id = id_for_key(session_id)
        self._user = id_for_key(user_id) if user_id is not None else None
        # A dict is checked and made a SessionSettings, as the SDK's own sessions do.
        self.session_settings: SessionSettings | None = (
            SessionSettings() if session_settings is None
            else session_settings if isinstance(session_settings, SessionSettings)
            else coerce_session_settings(dict(session_settings)))
        self.memory = memory
        self.user_id = user_id
        settings = memory.engine.settings
        window = Budget(context_window=settings.context_window, reply_reserve=settings.reply_reserve)
        self.budget = budget if budget is not None else window.input_tokens
        self.last_context: Context | None = None
        """The context the newest assembled ``get_items()`` / `context_items` returned, per layer."""
        self._assembled = False
        self._cost_seen = (0, 0)
        self._for_message: tuple[str, list[TResponseInputItem]] | None = None
        memory.submit(asyncio.sleep(0)).result()  # the loop thread exists before any caller's loop

    # -- plumbing ---------------------------------------------------------

    async def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return await asyncio.wrap_future(self.memory.submit(coro))

    def _lock(self) -> asyncio.Lock:
        # Created and used on the memory's loop thread only.
        key = (id(self.memory), self._id)
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    def _cost(self, turns: Sequence[Turn]) -> int:
        counter = self.memory.engine.counter
        return sum(t.tokens + message_overhead(counter, t.role) for t in turns)

    # -- the Session protocol ---------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The latest ``limit`` items oldest first; without a limit, the whole history while it
        fits the budget and the assembled context beyond it."""
        limit = resolve_session_limit(limit, self.session_settings)
        return await self._call(self._get_items(limit))

    async def _get_items(self, limit: int | None) -> list[TResponseInputItem]:
        async with self._lock():
            newest = await self.memory.anewest(self._id)
            last = newest.seq if newest is not None else 0
            if limit is not None:  # a turn holds at least one item: the last `limit` turns suffice
                if limit <= 0 or not last:
                    return []
                tail = await self.memory.aturns_between(self._id, max(1, last - limit + 1))
                return turns_to_items(tail)[-limit:]
            self._assembled = await self._history_cost(last) > self.budget
            if not self._assembled:
                return turns_to_items(await self.memory.aturns(self._id))
            try:
                context = await self.memory.acontinue(self._id, system_prompt=NO_SYSTEM_PROMPT)
            except MessageTooLarge:  # the newest message alone is over the budget: said, never hidden
                raise
            except InputError:  # no user message yet: nothing to assemble around
                self._assembled = False
                return turns_to_items(await self.memory.aturns(self._id))
            shown = [i.seq for name in ("recent", "current") if (layer := context.layer(name))
                     for i in layer.items if i.seq is not None]
            turns = await self.memory.aturns_between(self._id, min([*shown, last]), last)
        self.last_context = context
        step = [i.seq for i in (context.layer("current") or _NO_ITEMS).items if i.seq is not None]
        user_seq = min(step) - 1 if step else last  # the step is what follows the latest user turn
        by_seq = {t.seq: t for t in turns}
        if user_seq not in by_seq:
            by_seq.update({t.seq: t for t in await self.memory.aturns_between(self._id, user_seq, user_seq)})
        return context_to_items(context, by_seq, by_seq.get(user_seq))

    async def _history_cost(self, last: int) -> int:
        """Tokens of the whole stored history as messages, kept up to date from the new turns."""
        seen, cost = self._cost_seen
        if seen > last:  # the session shrank underneath (popped or cleared elsewhere)
            seen, cost = 0, 0
        if seen < last:
            cost += self._cost(await self.memory.aturns_between(self._id, seen + 1, last))
        self._cost_seen = (last, cost)
        return cost

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Store ``items`` after the existing ones, in one atomic append."""
        records = items_to_records(items)
        if records:
            await self._call(self._add(records))

    async def _add(self, records: Sequence[MessageRecord]) -> None:
        async with self._lock():
            await self.memory.arecord_messages(self._id, records, user_id=self._user)

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the newest item (``None`` when the session is empty)."""
        return await self._call(self._pop())

    async def _pop(self) -> TResponseInputItem | None:
        async with self._lock():
            popped = await self.memory.apop(self._id)
            self._cost_seen = (0, 0)
            if popped is None:
                return None
            items = _items_of(popped)
            if len(items) > 1:  # the turn stood for several items: keep all but the newest
                await self.memory.arecord_messages(self._id, items_to_records(
                    cast(list[TResponseInputItem], items[:-1])), user_id=self._user)
            return cast(TResponseInputItem, items[-1])

    async def clear_session(self) -> None:
        """Erase the session and everything derived from it (`ContextMode.forget`)."""
        async def clear() -> None:
            async with self._lock():
                await self.memory.aforget(session_id=self._id)
                self._cost_seen = (0, 0)

        await self._call(clear())

    # -- beyond the protocol ---------------------------------------------

    async def context_items(self, message: str) -> list[TResponseInputItem]:
        """The assembled context for ``message`` (recall looks for it), as input items without
        the message itself: memory layers, then recent items verbatim. When ``message`` is
        already the newest stored user message (the SDK stores a run's input before its
        first model call), the context is the one continuing it, without it."""

        async def assemble() -> list[TResponseInputItem]:
            async with self._lock():
                newest = await self.memory.anewest(self._id)
                stored = newest is not None and newest.role == "user" and newest.content == message
                context = await (self.memory.acontinue(self._id, system_prompt=NO_SYSTEM_PROMPT) if stored
                                 else self.memory.acontext(self._id, message, system_prompt=NO_SYSTEM_PROMPT))
                seqs = [i.seq for i in (context.layer("recent") or _NO_ITEMS).items if i.seq is not None]
                turns = await self.memory.aturns_between(self._id, min(seqs), max(seqs)) if seqs else []
            self.last_context = context
            return context_to_items(context, {t.seq: t for t in turns}, None, current=False)

        return await self._call(assemble())

    async def input_filter(self, data: CallModelData[Any]) -> ModelInputData:
        """A ``RunConfig.call_model_input_filter``: when ``get_items()`` assembled the history,
        assemble it again around the run's new user message, so recall looks for what is asked
        now (``get_items()`` alone knows only the stored messages). The new message and the
        items this run made are kept as they are; nothing here is stored."""
        items = data.model_data.input
        if not self._assembled:
            return data.model_data
        at = next((i for i in range(len(items) - 1, -1, -1) if _is_user(items[i])), None)
        if at is None:
            return data.model_data
        message = _text_of(cast(Mapping[str, Any], items[at]).get("content"))
        if not message.strip():
            return data.model_data
        if self._for_message is None or self._for_message[0] != message:
            self._for_message = (message, await self.context_items(message))
        return ModelInputData(input=[*self._for_message[1], *items[at:]],
                              instructions=data.model_data.instructions)

    async def run_compaction(self, args: Mapping[str, Any] | None = None) -> None:
        """The SDK's compaction step: wait for the summaries, pins and emotion scores the stored
        items scheduled, so the next ``get_items()`` assembles from them."""
        await self._call(self.memory.engine.drain())
