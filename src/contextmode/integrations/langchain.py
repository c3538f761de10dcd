"""context-mode as the memory of LangChain v1 agents, LangGraph's prebuilt agent and
``RunnableWithMessageHistory`` (extra: ``langchain``).

- `ContextModeMiddleware`: an ``AgentMiddleware`` for ``langchain.agents.create_agent``.
  Before each model call it stores the messages the agent added since the last call and
  replaces the agent's messages with the assembled context (one system message with the
  summary, pins, key moments and recall, then the recent turns, the user's message and
  the current tool-calling step), like LangChain's own ``SummarizationMiddleware`` does with
  its summary; after the call it stores the model's answer. Its `pre_model_hook` does the
  same for ``langgraph.prebuilt.create_react_agent`` through ``llm_input_messages``
  (the graph's state is left alone).
- `ContextModeChatMessageHistory`: a ``BaseChatMessageHistory`` whose messages come back
  equal (``==``) to those added, tool calls and ids included.

```python
from langchain.agents import create_agent
from contextmode.integrations.langchain import ContextModeMiddleware

agent = create_agent("openai:gpt-4o-mini", tools=[...], middleware=[ContextModeMiddleware("user-42")])
agent.invoke({"messages": [{"role": "user", "content": "I'm vegetarian; plan dinner"}]})
```
"""

from __future__ import annotations

import json
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, TypeVar, cast

from langchain.agents.middleware import AgentMiddleware, AgentState
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    FunctionMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
    message_to_dict,
    messages_from_dict,
)
from langchain_core.messages import ChatMessage as LCChatMessage
from langchain_core.messages.tool import ToolCall as LCToolCall
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langgraph.config import get_config
from langgraph.graph.message import REMOVE_ALL_MESSAGES
from langgraph.runtime import Runtime

from ..api import ContextMode, MessageRecord
from ..assembly import Context
from ..types import ChatMessage, Role, ToolCall, Turn
from ._session import SessionMemory, memory_messages

V = TypeVar("V")

__all__ = [
    "ID_PREFIX",
    "ContextModeChatMessageHistory",
    "ContextModeMiddleware",
    "context_to_messages",
    "message_to_record",
    "turn_to_message",
]

ID_PREFIX = "contextmode:"
"""Ids of the messages the adapter builds from the context (never stored again)."""
_KEY = "langchain"
"""The turn metadata key holding the original message (``message_to_dict``, without its text)."""
_ROLES: dict[str, Role] = {
    "human": "user", "user": "user", "ai": "assistant", "assistant": "assistant",
    "system": "system", "developer": "system", "tool": "tool", "function": "tool",
}


# -- messages <-> turns ---------------------------------------------------------


def _text(message: BaseMessage) -> str:
    return str(message.text)


def _role(message: BaseMessage) -> Role:
    if isinstance(message, LCChatMessage):
        return _ROLES.get(message.role.lower(), "user")
    return _ROLES.get(message.type, "user")


def _calls(message: BaseMessage) -> tuple[ToolCall, ...]:
    if not isinstance(message, AIMessage):
        return ()
    return tuple(
        ToolCall(id=call.get("id") or "", name=call["name"], arguments=json.dumps(call["args"], ensure_ascii=False))
        for call in message.tool_calls
    )


def _call_id(message: BaseMessage) -> str | None:
    if isinstance(message, ToolMessage):
        return message.tool_call_id
    if isinstance(message, FunctionMessage):
        return message.name
    return None


def message_to_record(message: BaseMessage) -> MessageRecord:
    """The turn a message is stored as: its role, text, tool calls or call id for the
    engine, and the whole message in the metadata so `turn_to_message` gives it back equal."""
    text = _text(message)
    data = message_to_dict(message)
    if data["data"].get("content") == text:
        del data["data"]["content"]  # the turn's text already holds it
    chat = ChatMessage(role=_role(message), content=text, tool_calls=_calls(message), tool_call_id=_call_id(message))
    return MessageRecord(message=chat, metadata={_KEY: data})


def _args(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments)
    except ValueError:
        return {"input": arguments}
    return value if isinstance(value, dict) else {"input": value}


def _message(role: Role, text: str, calls: Sequence[ToolCall], call_id: str | None, msg_id: str | None) -> BaseMessage:
    if role == "assistant":
        tool_calls = [LCToolCall(name=c.name, args=_args(c.arguments), id=c.id or None) for c in calls]
        return AIMessage(content=text, tool_calls=tool_calls, id=msg_id)
    if role == "tool":
        return ToolMessage(content=text, tool_call_id=call_id or "", id=msg_id)
    if role == "system":
        return SystemMessage(content=text, id=msg_id)
    return HumanMessage(content=text, id=msg_id)


def turn_to_message(turn: Turn) -> BaseMessage:
    """The message a turn was stored from (equal to it), or, for a turn stored another way
    (`ContextMode.chat`, the HTTP API), the message its role, text and tool fields make."""
    data = turn.metadata.get(_KEY)
    if isinstance(data, dict) and isinstance(data.get("data"), dict):
        body = dict(data["data"])
        body.setdefault("content", turn.content)
        return messages_from_dict([{"type": data["type"], "data": body}])[0]
    return _message(turn.role, turn.content, turn.tool_calls, turn.tool_call_id, None)


def context_to_messages(context: Context, current: BaseMessage | None = None) -> list[BaseMessage]:
    """The assembled context as LangChain messages: a system message with the memory layers
    (summary, pins, key moments, recall; none when they are empty; never the engine's own
    system prompt: the agent's is the only one), the recent turns, the user's message
    (``current`` itself when given and its text is the one sent), then the current
    tool-calling step. Built messages get ids starting with `ID_PREFIX`."""
    out: list[BaseMessage] = []
    chat = memory_messages(context)
    recent = context.layer("recent")
    at = (1 if chat and chat[0].role == "system" else 0) + (len(recent.items) if recent else 0)
    for i, m in enumerate(chat):
        if i == at and current is not None and _text(current) == m.content:
            out.append(current)
            continue
        out.append(_message(m.role, m.content, m.tool_calls, m.tool_call_id, f"{ID_PREFIX}{uuid.uuid4().hex}"))
    return out


# -- RunnableWithMessageHistory -------------------------------------------------


class ContextModeChatMessageHistory(BaseChatMessageHistory):
    """A ``BaseChatMessageHistory`` stored in context-mode: messages come back equal to the
    ones added, in order; summaries, pins and recall are kept for them as for any session.

    ``memory``: the `ContextMode` to use (default: the process's one on the embedded
    defaults, shared by every history). ``user_id``: the session's owner
    (`ContextMode.forget` erases by it).
    """

    def __init__(self, session_id: str, *, memory: ContextMode | None = None, user_id: str | None = None) -> None:
        self.session = SessionMemory(session_id, memory=memory, budget=None, user_id=user_id)

    @property
    def session_id(self) -> str:
        """The key as given (stored under `contextmode.session_keys.id_for_key` of it)."""
        return self.session.key

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override, unused-ignore]
        """Every message of the session, oldest first."""
        return [turn_to_message(t) for t in self.session.wait(self.session.turns())]

    async def aget_messages(self) -> list[BaseMessage]:
        return [turn_to_message(t) for t in await self.session.call(self.session.turns())]

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        self.session.wait(self.session.record([message_to_record(m) for m in messages]))

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        await self.session.call(self.session.record([message_to_record(m) for m in messages]))

    def clear(self) -> None:
        self.session.wait(self.session.clear())

    async def aclear(self) -> None:
        await self.session.call(self.session.clear())


# -- create_agent / create_react_agent ---------------------------------------------

SESSIONS_KEPT = 1024
"""Sessions (LangGraph threads) a middleware keeps at hand; the least recently used beyond are dropped."""


def _keep_recent(entries: OrderedDict[str, V], key: str) -> None:
    """Mark ``key`` used last and drop the least recently used entries beyond `SESSIONS_KEPT`."""
    entries.move_to_end(key)
    while len(entries) > SESSIONS_KEPT:
        entries.popitem(last=False)



def _persona(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    """The application's own system messages at the head of the state (its persona): kept
    first as they are and never stored; the memory message built here (`ID_PREFIX`) is not one."""
    head: list[BaseMessage] = []
    for message in messages:
        if not isinstance(message, SystemMessage) or (message.id or "").startswith(ID_PREFIX):
            break
        head.append(message)
    return head


class ContextModeMiddleware(AgentMiddleware[AgentState[Any], Any, Any]):
    """Memory for a ``create_agent`` agent (module docstring).

    ``session_id``: the context-mode session; default the LangGraph thread
    (``config["configurable"]["thread_id"]``), so one middleware serves every thread.
    ``memory``: the `ContextMode` to use (default: the process's one on the embedded
    defaults); ``budget``: input tokens of the context when the default is built.
    ``user_id``: the sessions' owner. ``record=False`` stores nothing (a read-only view of
    sessions recorded elsewhere: the model gets the context for the newest user message).
    ``last_context`` is the context handed to the model last, per layer with tokens.
    """

    def __init__(
        self,
        session_id: str | None = None,
        *,
        memory: ContextMode | None = None,
        budget: int | None = None,
        user_id: str | None = None,
        record: bool = True,
    ) -> None:
        super().__init__()
        self._fixed = session_id
        self._memory = memory
        self._budget = budget
        self._user_id = user_id
        self._recording = record
        self._sessions: OrderedDict[str, SessionMemory] = OrderedDict()
        """The sessions used lately, at most `SESSIONS_KEPT` (a dropped one is rebuilt on its next use)."""
        self._stored: OrderedDict[str, set[str]] = OrderedDict()
        """Ids of the messages stored per session (seeded from the store on first use), as many
        sessions as ``_sessions``."""
        self.last_context: Context | None = None

    # -- plumbing -------------------------------------------------------------

    def _session(self, config: RunnableConfig | None) -> SessionMemory:
        sid = self._fixed
        if sid is None:
            configurable = (config if config is not None else get_config()).get("configurable") or {}
            sid = configurable.get("thread_id")
            if not sid:
                raise ValueError("ContextModeMiddleware needs a session id or a thread_id in the config")
            sid = str(sid)
        session = self._sessions.get(sid)
        if session is None:
            session = self._sessions[sid] = SessionMemory(
                sid, memory=self._memory, budget=self._budget, user_id=self._user_id)
        _keep_recent(self._sessions, sid)
        return session

    async def _stored_ids(self, session: SessionMemory) -> set[str]:
        ids = self._stored.get(session.session_id)
        if ids is None:
            ids = {
                str(data["data"]["id"]) for t in await session.turns()
                if isinstance(data := t.metadata.get(_KEY), dict) and data.get("data", {}).get("id")
            }
            self._stored[session.session_id] = ids
        _keep_recent(self._stored, session.session_id)
        return ids

    async def _record(self, session: SessionMemory, messages: Sequence[BaseMessage]) -> None:
        if not self._recording:
            return
        await session.record([message_to_record(m) for m in messages])
        ids = self._stored.get(session.session_id)
        if ids is not None:  # else dropped: seeded again from the store, these included
            ids.update(str(m.id) for m in messages)

    async def _unstored(self, session: SessionMemory, messages: Sequence[BaseMessage]) -> list[BaseMessage]:
        """The messages added since the adapter last saw the state (oldest first)."""
        stored = await self._stored_ids(session)
        fresh: list[BaseMessage] = []
        for message in reversed(messages):
            if message.id is None:
                message.id = str(uuid.uuid4())
            if message.id.startswith(ID_PREFIX) or message.id in stored:
                break
            fresh.append(message)
        return fresh[::-1]

    async def _context(self, session: SessionMemory, messages: Sequence[BaseMessage]) -> list[BaseMessage]:
        """Store what is new, then the context: for a new user message, the one context-mode
        assembles for it (then the message is stored); otherwise the one that continues the
        stored session (the step's tool calls and results)."""
        persona = _persona(messages)
        messages = messages[len(persona):]
        fresh = await self._unstored(session, messages) if self._recording else list(messages[-1:])
        current = fresh[-1] if fresh and isinstance(fresh[-1], HumanMessage) and _text(fresh[-1]).strip() else None
        if current is None:
            await self._record(session, fresh)
            context = await session.context_to_continue()
        else:
            await self._record(session, fresh[:-1])
            context = await session.context_for(_text(current), None)
            await self._record(session, [current])
        self.last_context = context
        return [*persona, *context_to_messages(context, current)]

    async def _answer(self, session: SessionMemory, messages: Sequence[BaseMessage]) -> None:
        if self._recording and messages and isinstance(messages[-1], AIMessage):
            await self._record(session, await self._unstored(session, messages))

    # -- AgentMiddleware --------------------------------------------------------

    def before_model(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        session = self._session(None)
        built = session.wait(self._context(session, state["messages"]))
        return {"messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), *built]}

    async def abefore_model(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        session = self._session(None)
        built = await session.call(self._context(session, state["messages"]))
        return {"messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), *built]}

    def after_model(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        session = self._session(None)
        session.wait(self._answer(session, state["messages"]))
        return None

    async def aafter_model(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        session = self._session(None)
        await session.call(self._answer(session, state["messages"]))
        return None

    # -- langgraph.prebuilt.create_react_agent ------------------------------------

    def _hook(self, state: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
        session = self._session(config)
        return {"llm_input_messages": session.wait(self._context(session, state["messages"]))}

    async def _ahook(self, state: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
        session = self._session(config)
        return {"llm_input_messages": await session.call(self._context(session, state["messages"]))}

    def _post(self, state: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
        session = self._session(config)
        session.wait(self._answer(session, state["messages"]))
        return {}

    async def _apost(self, state: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
        session = self._session(config)
        await session.call(self._answer(session, state["messages"]))
        return {}

    @property
    def pre_model_hook(self) -> RunnableLambda[dict[str, Any], dict[str, Any]]:
        """For ``create_react_agent(..., pre_model_hook=mw.pre_model_hook)``: stores the new
        messages and gives the model the assembled context as ``llm_input_messages`` (the
        graph's own messages are left as they are)."""
        return cast(RunnableLambda[dict[str, Any], dict[str, Any]],
                    RunnableLambda(self._hook, afunc=self._ahook, name="contextmode_pre_model_hook"))

    @property
    def post_model_hook(self) -> RunnableLambda[dict[str, Any], dict[str, Any]]:
        """For ``create_react_agent(..., post_model_hook=mw.post_model_hook)``: stores the
        model's answer at once (without it the answer is stored at the next model call,
        which needs a checkpointer to still have it)."""
        return cast(RunnableLambda[dict[str, Any], dict[str, Any]],
                    RunnableLambda(self._post, afunc=self._apost, name="contextmode_post_model_hook"))
