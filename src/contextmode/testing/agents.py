"""Agent conversations for tests: generated tool-call histories and OpenAI's pairing rules.

`pairing_errors` checks a chat request the way the OpenAI API does: an assistant
message with ``tool_calls`` must be followed by one ``tool`` message per call
id (in any order) before anything else, and a ``tool`` message must answer a
call of that assistant message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..types import ChatMessage

__all__ = ["pairing_errors", "wire_pairing_errors"]


def pairing_errors(messages: Sequence[ChatMessage]) -> list[str]:
    """What makes ``messages`` invalid by OpenAI's tool-call pairing rules (empty = valid)."""
    return wire_pairing_errors(
        [
            {
                "role": m.role,
                "tool_calls": [{"id": c.id} for c in m.tool_calls] or None,
                "tool_call_id": m.tool_call_id,
            }
            for m in messages
        ]
    )


def wire_pairing_errors(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """`pairing_errors` for messages in OpenAI's JSON shape (what a model server receives)."""
    errors: list[str] = []
    waiting: set[str] = set()
    answerable: set[str] = set()
    for i, m in enumerate(messages):
        role = m.get("role")
        if role == "tool":
            call_id = m.get("tool_call_id")
            if call_id not in answerable:
                errors.append(f"message {i}: tool result {call_id!r} answers no call of the assistant message before it")
            answerable.discard(call_id)
            waiting.discard(call_id)
            continue
        if waiting:
            errors.append(f"message {i}: calls {sorted(waiting)} have no result before a {role} message")
        calls = m.get("tool_calls") or []
        ids = [str(c.get("id")) for c in calls]
        if len(set(ids)) != len(ids):
            errors.append(f"message {i}: duplicate tool call ids {ids}")
        waiting = set(ids) if role == "assistant" else set()
        answerable = set(waiting)
    if waiting:
        errors.append(f"end: calls {sorted(waiting)} have no result")
    return errors
