"""context-mode as a LlamaIndex memory (extra: ``llama-index``).

`ContextModeMemory` goes where ``Memory`` / ``ChatMemoryBuffer`` go: chat engines
(``SimpleChatEngine.from_defaults(memory=...)``, ``CondensePlusContextChatEngine``…) and
agents (``FunctionAgent.run(..., memory=...)``). ``put`` stores a message, ``get_all`` gives
every message back equal to what was put, and ``get`` gives what the model should
receive: context-mode's assembled context (a system message with the summary, pins, key
moments and recall, then the recent turns, the user's message and the current tool step)
within the budget, instead of a FIFO window.

The user's newest message is stored when its context is assembled (``get``) or at the
next ``put`` / ``get_all``: context-mode assembles the context *for* a message before
storing it, so recall searches the history without the question itself.

```python
from llama_index.core.chat_engine import SimpleChatEngine
from contextmode.integrations.llama_index import ContextModeMemory

engine = SimpleChatEngine.from_defaults(llm=llm, memory=ContextModeMemory("user-42"))
print(engine.chat("I'm vegetarian; plan dinner"))
```
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, MessageRole, TextBlock, ToolCallBlock
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.memory.types import BaseMemory

from ..api import ContextMode, MessageRecord
from ..assembly import Context
from ..errors import InputError, MessageTooLarge
from ..types import ChatMessage as CMMessage
from ..types import Role, ToolCall, Turn
from ._session import SessionMemory, memory_messages

__all__ = ["ContextModeMemory", "context_to_messages", "message_to_record", "turn_to_message"]

_KEY = "llama_index"
"""The turn metadata key holding the original message (``model_dump``, without its text)."""
_ROLES: dict[str, Role] = {
    "user": "user", "assistant": "assistant", "chatbot": "assistant", "model": "assistant",
    "system": "system", "developer": "system", "tool": "tool", "function": "tool",
}


# -- messages <-> turns ---------------------------------------------------------------


def _arguments(kwargs: object) -> str:
    return kwargs if isinstance(kwargs, str) else json.dumps(kwargs, ensure_ascii=False)


def _calls(message: ChatMessage) -> tuple[ToolCall, ...]:
    calls = [
        ToolCall(id=b.tool_call_id or "", name=b.tool_name, arguments=_arguments(b.tool_kwargs))
        for b in message.blocks if isinstance(b, ToolCallBlock)
    ]
    for raw in message.additional_kwargs.get("tool_calls") or ():
        # OpenAI's shape, as LlamaIndex's OpenAI LLM keeps it (a dict or the SDK's object)
        data = raw if isinstance(raw, dict) else getattr(raw, "model_dump", dict)()
        function = data.get("function") or {}
        if function.get("name"):
            calls.append(ToolCall(id=str(data.get("id") or ""), name=str(function["name"]),
                                  arguments=str(function.get("arguments") or "{}")))
    return tuple(calls)


def message_to_record(message: ChatMessage) -> MessageRecord:
    """The turn a message is stored as: its role, text, tool calls or call id for the
    engine, and the whole message in the metadata so `turn_to_message` gives it back equal."""
    role = _ROLES.get(str(message.role.value), "user")
    text = message.content or ""
    data = message.model_dump(mode="json")
    if message.blocks == [TextBlock(text=text)]:
        del data["blocks"]  # the turn's text already holds it
    call_id = message.additional_kwargs.get("tool_call_id")
    chat = CMMessage(role=role, content=text, tool_calls=_calls(message),
                     tool_call_id=str(call_id) if role == "tool" and call_id is not None else None)
    return MessageRecord(message=chat, metadata={_KEY: data})


def _message(role: Role, text: str, calls: Sequence[ToolCall], call_id: str | None) -> ChatMessage:
    if role == "assistant" and calls:
        blocks: list[Any] = [TextBlock(text=text)] if text else []
        blocks += [ToolCallBlock(tool_call_id=c.id or None, tool_name=c.name, tool_kwargs=_kwargs(c.arguments))
                   for c in calls]
        return ChatMessage(role=MessageRole.ASSISTANT, blocks=blocks)
    if role == "tool":
        return ChatMessage(role=MessageRole.TOOL, content=text, additional_kwargs={"tool_call_id": call_id or ""})
    return ChatMessage(role=MessageRole(role), content=text)


def _kwargs(arguments: str) -> dict[str, Any] | str:
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return value if isinstance(value, dict) else arguments


def turn_to_message(turn: Turn) -> ChatMessage:
    """The message a turn was stored from (equal to it), or, for a turn stored another way
    (`ContextMode.chat`, the HTTP API), the message its role, text and tool fields make."""
    data = turn.metadata.get(_KEY)
    if isinstance(data, dict):
        body = dict(data)
        if "blocks" not in body:
            body["blocks"] = [{"block_type": "text", "text": turn.content}]
        return ChatMessage.model_validate(body)
    return _message(turn.role, turn.content, turn.tool_calls, turn.tool_call_id)


def context_to_messages(context: Context, current: ChatMessage | None = None) -> list[ChatMessage]:
    """The assembled context as LlamaIndex messages: a system message with the memory layers
    (summary, pins, key moments, recall; none when they are empty; never the engine's own
    system prompt: the chat engine's or agent's is the only one), the recent turns, the
    user's message (``current`` itself when given and its text is the one sent), then the
    current tool-calling step."""
    chat = memory_messages(context)
    recent = context.layer("recent")
    at = (1 if chat and chat[0].role == "system" else 0) + (len(recent.items) if recent else 0)
    return [
        current if i == at and current is not None and (current.content or "") == m.content
        else _message(m.role, m.content, m.tool_calls, m.tool_call_id)
        for i, m in enumerate(chat)
    ]


# -- the memory ---------------------------------------------------------------------------

RENDERED_KEPT = 8
"""How many of the memory messages it built last a `ContextModeMemory` recognises when they come back."""


class ContextModeMemory(BaseMemory):
    """A LlamaIndex memory on context-mode (module docstring).

    ``memory``: the `ContextMode` to use (default: the process's one on the embedded
    defaults); ``budget``: input tokens of the context when the default is built;
    ``user_id``: the session's owner (`ContextMode.forget` erases by it). ``record=False``
    stores nothing (a read-only view of a session recorded elsewhere: ``get`` assembles the
    context for the newest user message put). ``last_context`` is the context ``get`` gave
    last, per layer with tokens.
    """

    session_id: str
    record: bool = True
    _session: SessionMemory = PrivateAttr()
    _pending: ChatMessage | None = PrivateAttr(default=None)
    _given: list[ChatMessage] | None = PrivateAttr(default=None)
    _rendered: list[str] = PrivateAttr(default_factory=list)
    """The memory messages ``get`` built lately: one handed back (``set(get())``, an agent
    putting its input back) is recognised and never stored as the application's text."""
    """What ``get`` returned, until the next write (an agent asks again at every step)."""

    def __init__(
        self,
        session_id: str,
        *,
        memory: ContextMode | None = None,
        budget: int | None = None,
        user_id: str | None = None,
        record: bool = True,
    ) -> None:
        super().__init__(session_id=session_id, record=record)  # type: ignore[call-arg, unused-ignore]  # pydantic fields
        self._session = SessionMemory(session_id, memory=memory, budget=budget, user_id=user_id)

    @classmethod
    def class_name(cls) -> str:
        return "ContextModeMemory"

    @classmethod
    def from_defaults(  # type: ignore[override, unused-ignore]
        cls,
        session_id: str = "default",
        *,
        memory: ContextMode | None = None,
        budget: int | None = None,
        user_id: str | None = None,
        record: bool = True,
    ) -> ContextModeMemory:
        """As the constructor (LlamaIndex builds memories with ``from_defaults``)."""
        return cls(session_id, memory=memory, budget=budget, user_id=user_id, record=record)

    @property
    def last_context(self) -> Context | None:
        return self._session.last_context

    # -- async (the engine's own) ---------------------------------------------------

    async def _store(self, messages: Sequence[ChatMessage]) -> None:
        if self.record:
            await self._session.record([message_to_record(m) for m in messages])

    async def _flush(self) -> None:
        self._given = None
        pending, self._pending = self._pending, None
        if pending is not None:
            await self._store([pending])

    def _remember(self, given: list[ChatMessage]) -> list[ChatMessage]:
        if given and given[0].role == MessageRole.SYSTEM and given[0].content:
            self._rendered = [*self._rendered[-(RENDERED_KEPT - 1):], given[0].content]
        return given

    async def _put(self, messages: Sequence[ChatMessage]) -> None:
        await self._flush()
        messages = [m for m in messages if not (m.role == MessageRole.SYSTEM and m.content in self._rendered)]
        if messages and messages[-1].role == MessageRole.USER and (messages[-1].content or "").strip():
            await self._store(messages[:-1])
            self._pending = messages[-1]
        else:
            await self._store(messages)

    async def _get(self) -> list[ChatMessage]:
        if self._given is not None:
            return list(self._given)
        pending, self._pending = self._pending, None
        if pending is not None:
            stored = message_to_record(pending) if self.record else None
            context = await self._session.context_for(pending.content or "", stored)
            self._given = self._remember(context_to_messages(context, pending))
            return list(self._given)
        try:
            context = await self._session.context_to_continue()
        except MessageTooLarge:  # the newest user message alone is over the budget: as `put` + `get`
            raise
        except InputError:  # no user turn yet: nothing to assemble around
            return [turn_to_message(t) for t in await self._session.turns()]
        self._given = self._remember(context_to_messages(context))
        return list(self._given)

    async def _all(self) -> list[ChatMessage]:
        await self._flush()
        return [turn_to_message(t) for t in await self._session.turns()]

    async def _set(self, messages: Sequence[ChatMessage]) -> None:
        await self._reset()
        await self._put(messages)

    async def _reset(self) -> None:
        self._pending = self._given = None
        if self.record:
            await self._session.clear()

    # -- BaseMemory ------------------------------------------------------------------

    def get(self, input: str | None = None, **kwargs: Any) -> list[ChatMessage]:
        """The messages for the model: the assembled context for the newest user message
        (``input`` and ``initial_token_count`` are accepted and not needed: the budget is
        context-mode's)."""
        return self._session.wait(self._get())

    async def aget(self, input: str | None = None, **kwargs: Any) -> list[ChatMessage]:
        return await self._session.call(self._get())

    def get_all(self) -> list[ChatMessage]:
        """Every message of the session, oldest first, equal to the ones put."""
        return self._session.wait(self._all())

    async def aget_all(self) -> list[ChatMessage]:
        return await self._session.call(self._all())

    def put(self, message: ChatMessage) -> None:
        self._session.wait(self._put([message]))

    async def aput(self, message: ChatMessage) -> None:
        await self._session.call(self._put([message]))

    def put_messages(self, messages: list[ChatMessage]) -> None:
        self._session.wait(self._put(messages))

    async def aput_messages(self, messages: list[ChatMessage]) -> None:
        await self._session.call(self._put(messages))

    def set(self, messages: list[ChatMessage]) -> None:
        """Replace the session's messages with ``messages``."""
        self._session.wait(self._set(messages))

    async def aset(self, messages: list[ChatMessage]) -> None:
        await self._session.call(self._set(messages))

    def reset(self) -> None:
        """Erase the session (its turns and everything derived from them)."""
        self._session.wait(self._reset())

    async def areset(self) -> None:
        await self._session.call(self._reset())
