"""Adapters: the same assembled layers as OpenAI messages, Anthropic messages or plain text."""

from __future__ import annotations

from typing import Any

from ..types import ChatMessage
from .context import Context, LayerItem
from .render import SECTION_SEPARATOR, after_window, indented

__all__ = ["to_anthropic", "to_messages", "to_text"]

_TURN_LAYERS = ("recent", "current")


def _system_content(context: Context, *, tail: bool = False) -> str:
    """The system message's sections, or (``tail``) those of the message after the turns."""
    after = after_window(context.order)
    return SECTION_SEPARATOR.join(
        layer.rendered for layer in context.layers
        if layer.name not in _TURN_LAYERS and layer.rendered and (layer.name in after) == tail
    )


def to_messages(context: Context) -> list[ChatMessage]:
    """OpenAI-style chat messages: one system message with the non-turn layers the order puts
    before the recent turns (or after the current message), then the recent turns, then one
    ``user`` message with the layers the order puts between the turns and the current message
    (what changes every turn: recall, key moments, the rewrite hint; `after_window`), then the
    current message as sent."""
    if context.format != "messages":
        return [ChatMessage(role="user", content=to_text(context))]
    messages: list[ChatMessage] = []
    system = _system_content(context)
    if system:
        messages.append(ChatMessage(role="system", content=system))
    recent = context.layer("recent")
    if recent is not None:
        messages.extend(_message(item) for item in recent.items)
    if tail := _system_content(context, tail=True):
        messages.append(ChatMessage(role="user", content=tail))
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


_EPHEMERAL = {"type": "ephemeral"}


def to_anthropic(context: Context, *, cache: bool = False) -> dict[str, Any]:
    """Anthropic-style request parts: ``{"system": str, "messages": [...]}`` with the system
    text apart and strict user/assistant alternation starting with a user turn
    (consecutive turns of one role are merged; a leading assistant turn is
    preceded by a short user marker).

    ``cache``: mark the end of what the next turn's request repeats with Anthropic's
    ``cache_control`` breakpoints (docs/caching.md): the system text and the newest recent turn,
    the prefix a prompt cache can serve. The system and the contents are then lists of ``text``
    blocks, the breakpoints on the blocks that end the stable part; two breakpoints of the
    four Anthropic allows."""
    messages = to_messages(context)
    recent = context.layer("recent")
    last_stable = (1 if messages and messages[0].role == "system" else 0) + (len(recent.items) if recent else 0) - 1
    system_parts = [m.content for m in messages if m.role == "system"]
    turns: list[dict[str, Any]] = []
    for index, m in enumerate(messages):
        if m.role == "system":
            continue
        role, content = _anthropic_turn(m)
        if cache:
            block: dict[str, Any] = {"type": "text", "text": content}
            if index == last_stable:
                block["cache_control"] = dict(_EPHEMERAL)
            if turns and turns[-1]["role"] == role:
                turns[-1]["content"].append(block)
            else:
                turns.append({"role": role, "content": [block]})
        elif turns and turns[-1]["role"] == role:
            turns[-1]["content"] += "\n\n" + content
        else:
            turns.append({"role": role, "content": content})
    if turns and turns[0]["role"] == "assistant":
        marker = "（继续之前的对话）" if context.locale.startswith("zh") else "(continuing our conversation)"
        turns.insert(0, {"role": "user", "content": [{"type": "text", "text": marker}] if cache else marker})
    system = "\n\n".join(system_parts)
    if cache:
        blocks = [{"type": "text", "text": system, "cache_control": dict(_EPHEMERAL)}] if system else []
        return {"system": blocks, "messages": turns}
    return {"system": system, "messages": turns}


def _anthropic_turn(m: ChatMessage) -> tuple[str, str]:
    """A message's Anthropic role and text: tool items go as text (a call as a sentence, a
    result as the user's side)."""
    content = m.content
    if m.tool_calls:
        content = (content + "\n" if content else "") + "; ".join(f"{c.name}({c.arguments})" for c in m.tool_calls)
    elif m.role == "tool":
        content = f"[{m.tool_call_id}] {content}"
    return ("user" if m.role == "tool" else m.role), content


def to_text(context: Context) -> str:
    """One plain-text prompt with section headings, in the configured order."""
    if context.format == "text":
        return SECTION_SEPARATOR.join(layer.rendered for layer in context.layers if layer.rendered)
    # A message-form context shown as text: each message under its role, its lines indented
    # so that no line of a message reads as another message's "[assistant]" heading.
    return "\n\n".join(f"[{m.role}]\n{indented(m.content)}" for m in to_messages(context))
