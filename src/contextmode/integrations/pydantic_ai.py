"""pydantic-ai: `ContextModeHistory`, a ``history_processors`` callable backed by context-mode.

```python
from pydantic_ai import Agent
from contextmode.integrations.pydantic_ai import ContextModeHistory

memory = ContextModeHistory("user-42")          # SQLite under CONTEXTMODE_HOME
agent = Agent("openai:gpt-4o", capabilities=[memory.capability])
agent.run_sync("I'm vegetarian, remember that")   # no message_history needed: the memory has it
agent.run_sync("Suggest a dinner")
```

``memory`` itself is the ``history_processors`` callable (pydantic-ai 2 takes it as
``capabilities=[ProcessHistory(memory)]``); `capability` adds storing each run's final
answer when the run ends, which a history processor alone never sees.

Before each model request it stores the messages it has not seen (the run's prompt, the
model's answers, tool calls and their returns: each a turn of context-mode's log, so agent
items are paired as in docs/agents.md) and hands the model the history: the stored messages
as they were while they fit the budget; beyond it the assembled context, as one request of
``SystemPromptPart``\\ s (pins, summary, key moments, recall: reference data) followed by the
recent turns as messages, then the run's own messages unchanged. The context is assembled
around the run's prompt before that prompt is stored, exactly as `ContextMode.context` does.

Works whether or not the application also passes ``message_history`` (messages already
stored are recognised and not stored twice; the context messages it made are marked in
their ``metadata`` and never stored). One writer per session: the processor remembers what
it stored.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic_ai.capabilities import ProcessHistory
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    ModelResponsePart,
    RetryPromptPart,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import RunContext

from ..api import ContextMode, MessageRecord
from ..assembly import Context, LayerItem
from ..memory.budget import Budget
from ..session_keys import id_for_key
from ..settings import EngineSettings
from ..tokens.tools import count_turn, message_overhead
from ..types import ChatMessage, ToolCall
from ._session import NO_SYSTEM_PROMPT, memory_sections

__all__ = ["ContextModeHistory", "context_to_messages", "message_to_records"]

_KEY = "pydantic_ai"
"""Turn metadata: the message (JSON, without the agent's system prompts) on its first turn."""
_MARK = {"contextmode": "context"}


def _user_text(part: UserPromptPart) -> str:
    if isinstance(part.content, str):
        return part.content
    return "\n".join(c for c in part.content if isinstance(c, str))


def _without_system(message: ModelMessage) -> ModelMessage:
    if isinstance(message, ModelRequest) and any(isinstance(p, SystemPromptPart) for p in message.parts):
        return replace(message, parts=[p for p in message.parts if not isinstance(p, SystemPromptPart)])
    return message


def _dump(message: ModelMessage) -> str:
    return ModelMessagesTypeAdapter.dump_json([_without_system(message)]).decode()


_VOLATILE = ("run_id", "conversation_id", "metadata", "timestamp", "state", "instructions")
"""Fields pydantic-ai may set on a message after a processor saw it: not part of its identity."""


def _key(dumped: str) -> str:
    """What identifies a stored message: its kind and parts (each part has its own time)."""
    value = json.loads(dumped)[0]
    return json.dumps({k: v for k, v in value.items() if k not in _VOLATILE}, sort_keys=True)


def _load(text: str) -> ModelMessage:
    return ModelMessagesTypeAdapter.validate_json(text)[0]


def _request_records(message: ModelRequest) -> list[ChatMessage]:
    out: list[ChatMessage] = []
    for part in message.parts:
        if isinstance(part, UserPromptPart):
            out.append(ChatMessage(role="user", content=_user_text(part)))
        elif isinstance(part, ToolReturnPart):
            out.append(ChatMessage(role="tool", content=part.model_response_str(), tool_call_id=part.tool_call_id))
        elif isinstance(part, RetryPromptPart):
            if part.tool_name:
                out.append(ChatMessage(role="tool", content=part.model_response(), tool_call_id=part.tool_call_id))
            else:
                out.append(ChatMessage(role="user", content=part.model_response()))
    return out


def message_to_records(message: ModelMessage) -> list[MessageRecord]:
    """A message as the turns that store it: a request's prompt is a user turn and each tool
    return a ``tool`` turn; a response is one assistant turn with its text and tool calls.
    The first turn keeps the whole message (``metadata["pydantic_ai"]``)."""
    if isinstance(message, ModelResponse):
        text = "\n".join(p.content for p in message.parts if isinstance(p, TextPart))
        calls = tuple(ToolCall(id=p.tool_call_id, name=p.tool_name, arguments=p.args_as_json_str())
                      for p in message.parts if isinstance(p, ToolCallPart))
        chats = [ChatMessage(role="assistant", content=text, tool_calls=calls)]
    else:
        chats = _request_records(message) or [ChatMessage(role="user", content="")]
    dumped = _dump(message)
    return [MessageRecord(message=m, metadata={_KEY: dumped} if i == 0 else {_KEY: None})
            for i, m in enumerate(chats)]


def _run_prompt(run: Sequence[ModelMessage]) -> str:
    head = run[0] if run else None
    if not isinstance(head, ModelRequest):
        return ""
    return next((_user_text(p) for p in head.parts if isinstance(p, UserPromptPart)), "")


def _is_prompt(message: ModelMessage) -> bool:
    return isinstance(message, ModelRequest) and any(isinstance(p, UserPromptPart) for p in message.parts)


def _ours(metadata: Mapping[str, object] | None) -> bool:
    """Whether a message or part carrying ``metadata`` is one this adapter built (the memory
    layers, the recent turns it hands the model): when it comes back in ``message_history``
    it is never stored, nor taken for the agent's own system prompt."""
    return bool(metadata and metadata.get("contextmode") == "context")


def _marked(message: ModelMessage) -> bool:
    return _ours(message.metadata)


def context_to_messages(context: Context, system: Sequence[SystemPromptPart] = ()) -> list[ModelMessage]:
    """The memory layers and recent turns of ``context`` as messages (marked as context-mode's):
    one request with ``system`` and a ``SystemPromptPart`` per memory layer (marked too), then
    each recent turn (a user prompt, an answer with its tool calls, tool returns)."""
    parts: list[ModelRequestPart] = list(system)
    parts += [SystemPromptPart(content=section, metadata=dict(_MARK)) for section in memory_sections(context)]
    out: list[ModelMessage] = [ModelRequest(parts=parts, metadata=dict(_MARK))] if parts else []
    recent = context.layer("recent")
    names: dict[str, str] = {}
    for item in recent.items if recent else ():
        _append(out, item, names)
    return out


def _append(out: list[ModelMessage], item: LayerItem, names: dict[str, str]) -> None:
    if item.role == "assistant":
        response: list[ModelResponsePart] = [TextPart(content=item.text)] if item.text else []
        for call in item.tool_calls:
            names[call.id] = call.name
            response.append(ToolCallPart(tool_name=call.name, args=call.arguments, tool_call_id=call.id))
        out.append(ModelResponse(parts=response, metadata=dict(_MARK)))
        return
    part: ModelRequestPart
    if item.role == "tool":
        part = ToolReturnPart(tool_name=names.get(item.tool_call_id or "", "tool"), content=item.text,
                              tool_call_id=item.tool_call_id or "")
        last = out[-1] if out else None
        if isinstance(last, ModelRequest) and _marked(last) and all(isinstance(p, ToolReturnPart) for p in last.parts):
            out[-1] = replace(last, parts=[*last.parts, part])
            return
    else:
        part = UserPromptPart(content=item.text)
    out.append(ModelRequest(parts=[part], metadata=dict(_MARK)))


@dataclass
class _Seen:
    """What this processor knows is stored: the messages' keys, up to turn ``seq``."""

    seq: int = 0
    dumps: list[str] = field(default_factory=list)
    """The stored messages (JSON), oldest first."""
    keys: list[str] = field(default_factory=list)
    """Their identities (`_key`)."""
    tokens: int = 0
    prompt: tuple[str, list[ModelMessage]] | None = None
    """The assembled history for the run's prompt (reused by the run's later requests)."""


class ContextModeHistory:
    """A pydantic-ai history processor on context-mode's memory (module docstring).

    ``memory``: the `ContextMode` (default: one on the embedded defaults). ``budget``: input
    tokens of history (default: the engine's input budget; given, it builds the default
    `ContextMode` with that window). ``record=False`` never stores: a read-only view for an
    application that stores its turns through `ContextMode` itself.
    """

    def __init__(
        self,
        session_id: str,
        *,
        memory: ContextMode | None = None,
        budget: int | None = None,
        user_id: str | None = None,
        record: bool = True,
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
        self.memory = memory
        self.user_id = user_id
        self.record = record
        settings = memory.engine.settings
        self.budget = budget if budget is not None else Budget(
            context_window=settings.context_window, reply_reserve=settings.reply_reserve).input_tokens
        self.last_context: Context | None = None
        """The newest assembled context, per layer (``None`` while the history fits)."""
        self._seen = _Seen()
        memory.submit(asyncio.sleep(0)).result()

    async def __call__(self, messages: list[ModelMessage]) -> list[ModelMessage]:
        return await asyncio.wrap_future(self.memory.submit(self._process(list(messages))))

    async def _refresh(self) -> None:
        """Read the turns stored since the last look (O(new turns))."""
        seen = self._seen
        fresh = await self.memory.aturns_between(self._id, seen.seq + 1, None)
        counter = self.memory.engine.counter
        for turn in fresh:
            dumped = turn.metadata.get(_KEY)
            if not isinstance(dumped, str) and _KEY not in turn.metadata:
                dumped = _dump(_plain(turn.role, turn.content))  # stored by another entry point
            if isinstance(dumped, str):
                seen.dumps.append(dumped)
                seen.keys.append(_key(dumped))
            seen.tokens += turn.tokens + message_overhead(counter, turn.role)
            seen.seq = turn.seq

    async def _process(self, messages: list[ModelMessage]) -> list[ModelMessage]:
        await self._refresh()
        real = [m for m in messages if not _marked(m)]
        # The agent's own system prompt: what it put first, not the layers rendered here last
        # run (they come back in message_history and would pile up).
        system = [p for m in messages[:1] if isinstance(m, ModelRequest) for p in m.parts
                  if isinstance(p, SystemPromptPart) and not _ours(p.metadata)]
        at = max((i for i, m in enumerate(real) if _is_prompt(m)), default=0)
        run = real[at:]
        fresh = real[len(real) - _unseen(_keys(real), self._seen.keys):]
        # What came before this run and is not stored yet (the last run's answer handed back
        # in message_history) is history: stored first. The run's own messages come after.
        before, fresh_run = fresh[: max(0, len(fresh) - len(run))], fresh[max(0, len(fresh) - len(run)):]
        await self._store(before)
        if self._seen.tokens + self._cost(fresh_run) <= self.budget:
            await self._store(fresh_run)
            return _with_system(system, self._whole(run, before))
        prompt = _run_prompt(run)
        cached = self._seen.prompt
        if prompt.strip() and (cached is None or cached[0] != prompt):
            # Assembled before the prompt is stored: the history around what is asked now.
            context = await self.memory.acontext(self._id, prompt, system_prompt=NO_SYSTEM_PROMPT)
            self.last_context = context
            cached = self._seen.prompt = (prompt, context_to_messages(context))
        await self._store(fresh_run)
        prefix = cached[1] if cached is not None else []
        return _with_system(system, [*prefix, *run])

    def _cost(self, messages: Sequence[ModelMessage]) -> int:
        """Tokens ``messages`` add to the stored history once stored (as `_refresh` counts them)."""
        counter = self.memory.engine.counter
        return sum(count_turn(counter, r.message.content, tool_calls=r.message.tool_calls,
                              tool_result=r.message.role == "tool") + message_overhead(counter, r.message.role)
                   for m in messages for r in message_to_records(m))

    def _whole(self, run: Sequence[ModelMessage], before: Sequence[ModelMessage]) -> list[ModelMessage]:
        """The stored history as it was, then the run's messages."""
        current = set(_keys(run))
        history = [_load(d) for d, k in zip(self._seen.dumps, self._seen.keys, strict=True) if k not in current]
        if not self.record:
            history += before
        return [*history, *run]

    @property
    def capability(self) -> ProcessHistory[Any]:
        """This processor as a pydantic-ai capability (``Agent(capabilities=[memory.capability])``)
        that also stores each run's final answer when the run ends (a history processor alone
        sees an answer only when the next run passes it back in ``message_history``)."""
        return _Remembering(processor=self, remember=self.remember)

    async def remember(self, messages: Sequence[ModelMessage]) -> None:
        """Store the messages of ``messages`` not stored yet (the context it made excepted)."""

        async def store() -> None:
            await self._refresh()
            real = [m for m in messages if not _marked(m)]
            await self._store(real[len(real) - _unseen(_keys(real), self._seen.keys):])

        await asyncio.wrap_future(self.memory.submit(store()))

    async def _store(self, messages: Sequence[ModelMessage]) -> None:
        if not self.record or not messages:
            return
        records = [r for m in messages for r in message_to_records(m)]
        await self.memory.arecord_messages(self._id, records, user_id=self._user)
        await self._refresh()


@dataclass
class _Remembering(ProcessHistory[Any]):
    """`ProcessHistory` that also stores the run's messages (its final answer) when it ends."""

    remember: Callable[[Sequence[ModelMessage]], Awaitable[None]] | None = None

    async def after_run(self, ctx: RunContext[Any], *, result: AgentRunResult[Any]) -> AgentRunResult[Any]:
        if self.remember is not None:
            await self.remember(result.all_messages())
        return result


def _plain(role: str, content: str) -> ModelMessage:
    if role == "assistant":
        return ModelResponse(parts=[TextPart(content=content)])
    return ModelRequest(parts=[UserPromptPart(content=content)])


def _keys(messages: Sequence[ModelMessage]) -> list[str]:
    return [_key(_dump(m)) for m in messages]


def _unseen(keys: Sequence[str], stored: Sequence[str]) -> int:
    """How many of ``keys`` (oldest first) come after what is stored: the longest prefix of
    ``keys`` that is a suffix of ``stored`` is already there."""
    first = keys[0] if keys else None
    for start in range(max(0, len(stored) - len(keys)), len(stored)):
        if stored[start] == first and list(stored[start:]) == list(keys[: len(stored) - start]):
            return len(keys) - (len(stored) - start)
    return len(keys)


def _with_system(system: Sequence[SystemPromptPart], messages: list[ModelMessage]) -> list[ModelMessage]:
    """``messages`` with the agent's system prompts once, at the head of the first request
    (pydantic-ai sends a system prompt found further down as a user message)."""
    if not system:
        return messages
    out = [replace(m, parts=[p for p in m.parts if p not in system]) if isinstance(m, ModelRequest) else m
           for m in messages]
    head = out[0] if out else None
    if isinstance(head, ModelRequest):
        return [replace(head, parts=[*system, *head.parts]), *out[1:]]
    return [ModelRequest(parts=list(system), metadata=dict(_MARK)), *out]
