"""Adapters: the same assembled layers as OpenAI messages, Anthropic messages or plain text."""

from __future__ import annotations

from typing import Any

from ..types import ChatMessage
from .context import Context, LayerItem
from .render import SECTION_SEPARATOR, indented

__all__ = ["to_anthropic", "to_messages", "to_text"]

_TURN_LAYERS = ("recent", "current")


def _system_content(context: Context) -> str:
    return SECTION_SEPARATOR.join(
        layer.rendered for layer in context.layers if layer.name not in _TURN_LAYERS and layer.rendered
    )


def to_messages(context: Context) -> list[ChatMessage]:
    """OpenAI-style chat messages: one system message with every non-turn layer in order,
    then the recent turns, then the current message."""
    if context.format != "messages":
        return [ChatMessage(role="user", content=to_text(context))]
    messages: list[ChatMessage] = []
    system = _system_content(context)
    if system:
        messages.append(ChatMessage(role="system", content=system))
    recent = context.layer("recent")
    if recent is not None:
        messages.extend(_message(item) for item in recent.items)
    messages.append(ChatMessage(role="user", content=context.message))
    current = context.layer("current")
    if current is not None:
        # An agent loop's current step: the calls and results that followed the message.
        messages.extend(_message(item) for item in current.items[1:])
    return messages


def _message(item: LayerItem) -> ChatMessage:
    return ChatMessage(
        role=item.role or "user", content=item.text, tool_calls=item.tool_calls, tool_call_id=item.tool_call_id
    )


def to_anthropic(context: Context) -> dict[str, Any]:
    """Anthropic-style request parts: ``{"system": str, "messages": [...]}`` with the system
    text apart and strict user/assistant alternation starting with a user turn
    (consecutive turns of one role are merged; a leading assistant turn is
    preceded by a short user marker)."""
    messages = to_messages(context)
    system_parts = [m.content for m in messages if m.role == "system"]
    turns: list[dict[str, str]] = []
    for m in messages:
        if m.role == "system":
            continue
        # Tool items go as text here (a call as a sentence, a result as the user's side).
        role = "user" if m.role == "tool" else m.role
        content = m.content
        if m.tool_calls:
            content = (content + "\n" if content else "") + "; ".join(f"{c.name}({c.arguments})" for c in m.tool_calls)
        elif m.role == "tool":
            content = f"[{m.tool_call_id}] {content}"
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"] += "\n\n" + content
        else:
            turns.append({"role": role, "content": content})
    if turns and turns[0]["role"] == "assistant":
        marker = "（继续之前的对话）" if context.locale.startswith("zh") else "(continuing our conversation)"
        turns.insert(0, {"role": "user", "content": marker})
    return {"system": "\n\n".join(system_parts), "messages": turns}


def to_text(context: Context) -> str:
    """One plain-text prompt with section headings, in the configured order."""
    if context.format == "text":
        return SECTION_SEPARATOR.join(layer.rendered for layer in context.layers if layer.rendered)
    # A message-form context shown as text: each message under its role, its lines indented
    # so that no line of a message reads as another message's "[assistant]" heading.
    return "\n\n".join(f"[{m.role}]\n{indented(m.content)}" for m in to_messages(context))
