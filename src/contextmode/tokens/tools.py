"""What agent items cost: tool calls and tool results in each model family's chat format.

A tool call is rendered by the family's chat template around its name and
arguments (Qwen2 writes ``<tool_call>{"name": …, "arguments": …}</tool_call>``,
DeepSeek V3 its ``<｜tool▁call▁begin｜>`` markers, OpenAI models a function
header); a tool result is its content inside the family's result markers. The
wrappers are counted with the family's own counter, so the cost is as exact as
the counter is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..types import ChatMessage, ToolCall
from .base import TokenCounter

__all__ = ["count_messages", "count_turn", "family_of", "message_overhead", "tool_call_text", "tool_result_text"]

_OPENAI = frozenset({"o200k_base", "cl100k_base"})


def family_of(counter: TokenCounter) -> str:
    """The chat-template family of ``counter`` (``o200k_base``, ``qwen2``, ``deepseek_v3``, ``generic``)."""
    name = counter.name.removeprefix("estimate:")
    return name if name in _OPENAI or name in ("qwen2", "deepseek_v3") else "generic"


def tool_call_text(family: str, call: ToolCall) -> str:
    """``call`` as the family's template writes it into an assistant message."""
    if family == "qwen2":
        return f'<tool_call>\n{{"name": "{call.name}", "arguments": {call.arguments}}}\n</tool_call>'
    if family == "deepseek_v3":
        return f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{call.name}\n```json\n{call.arguments}\n```<｜tool▁call▁end｜>"
    # OpenAI models (and unknown ones): a function header with the arguments and the call id.
    return f"functions.{call.name}:{call.id}\n{call.arguments}"


def tool_result_text(family: str, content: str) -> str:
    """A tool result's content as the family's template wraps it."""
    if family == "qwen2":
        return f"<tool_response>\n{content}\n</tool_response>"
    if family == "deepseek_v3":
        return f"<｜tool▁output▁begin｜>{content}<｜tool▁output▁end｜>"
    return content


def count_turn(
    counter: TokenCounter,
    content: str,
    *,
    tool_calls: Sequence[ToolCall] = (),
    tool_result: bool = False,
) -> int:
    """Tokens of one turn's body (no per-message overhead): its text, plus each tool call's
    name and arguments in the family's format, or the result markers of a tool result."""
    family = family_of(counter)
    if tool_result:
        return counter.count(tool_result_text(family, content))
    return counter.count(content) + sum(counter.count(tool_call_text(family, c)) for c in tool_calls)


def message_overhead(counter: TokenCounter, role: str) -> int:
    """Tokens the chat format adds around one message of ``role`` (a tool result costs what a
    user message does when the family names no overhead of its own for it)."""
    per_role: Mapping[str, int] = getattr(counter, "role_overheads", None) or {}
    if role == "tool" and "tool" not in per_role:
        return per_role.get("user", counter.message_overhead)
    return per_role.get(role, counter.message_overhead)


def count_messages(counter: TokenCounter, messages: Sequence[ChatMessage]) -> int:
    """Tokens of a whole chat request: contents, tool calls and results, per-message
    overhead, reply priming."""
    return (
        sum(
            count_turn(counter, m.content, tool_calls=m.tool_calls, tool_result=m.role == "tool")
            + message_overhead(counter, m.role)
            for m in messages
        )
        + counter.reply_overhead
    )
