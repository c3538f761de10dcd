"""What a follow-up template ("举个例子", "Summarize my plan") is built over.

The original design answers a follow-up intent with a template over the last answer. On
the embedded defaults (no model) every answer is an engine notice, so there is no
answer to build on; the follow-up is still answered, over the last real exchange:

- detail / simplify / example: the last real answer when there is one; otherwise the
  user's previous message (its standalone rewrite when one was verified), labelled as such;
- summary: the conversation, not only the last answer: the summary, the pinned
  constraints and the newest real turns, newest kept when they must be cut.

`follow_up_context` returns ``None`` only when nothing in the session was ever answered
(no answer, not even a notice, and no summary): the caller refuses with `NoPreviousAnswer`.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..assembly.render import constraint_line, layer_title, turn_line
from ..processors.base import IntentKind
from ..types import SessionState, Turn

__all__ = ["TEMPLATE_INTENTS", "answered_before", "follow_up_context"]

TEMPLATE_INTENTS: frozenset[str] = frozenset({"detail", "simplify", "example", "summary"})
"""Follow-up intents answered by a template; a pronoun goes through the rewriter instead."""

_PREVIOUS: dict[str, str] = {
    "zh": "用户的上一个问题（还没有模型回答过）：",
    "en": "The user's previous message (no model has answered it yet): ",
}


def answered_before(raw: SessionState) -> bool:
    """Whether anything in the session was answered: an answer (a notice counts) or a summary.

    ``raw`` is the state as loaded, engine notices included."""
    return (
        raw.last_answer is not None
        or raw.summary is not None
        or any(t.role == "assistant" for t in raw.turns)
    )


def follow_up_context(state: SessionState, intent: IntentKind, locale: str) -> str | None:
    """The text the ``intent`` template is built over, from ``state`` (engine notices
    already left out), or ``None`` when there is nothing to build on."""
    lang = "zh" if locale.startswith("zh") else "en"
    if intent == "summary":
        return _conversation(state, lang) or None
    if state.last_answer and state.last_answer.strip():
        return state.last_answer
    question = _previous_question(state.turns)
    if question is None:
        return None
    return _PREVIOUS[lang] + question


def _previous_question(turns: Sequence[Turn]) -> str | None:
    """The user's newest message that is not itself a template follow-up (its verified
    rewrite when it has one)."""
    for turn in reversed(turns):
        if turn.role != "user" or turn.metadata.get("intent") in TEMPLATE_INTENTS:
            continue
        rewrite = turn.metadata.get("rewrite")
        if turn.metadata.get("rewrite_verified") and isinstance(rewrite, str) and rewrite.strip():
            return rewrite.strip()
        if turn.content.strip():
            return turn.content.strip()
    return None


def _conversation(state: SessionState, lang: str) -> str:
    """The summary, the pins and the newest real turns, as sections."""
    parts: list[str] = []
    if state.summary is not None and state.summary.text.strip():
        parts.append(f"{layer_title('summary', lang)}:\n{state.summary.text.strip()}")
    if state.constraints:
        pins = "\n".join(constraint_line(c) for c in state.constraints)
        parts.append(f"{layer_title('constraints', lang)}:\n{pins}")
    lines = [
        turn_line(t, lang)
        for t in state.turns
        if t.role in ("user", "assistant") and not t.tool_calls and t.content.strip()
        and t.metadata.get("intent") != "summary"
    ]
    if lines:
        parts.append(f"{layer_title('recent', lang)}:\n" + "\n".join(lines))
    return "\n\n".join(parts)
