"""The model's context window, for the LLM processors' own calls.

A small local model serves a window of a few thousand tokens (SmolLM2 behind llama.cpp: 4,096),
and a server refuses a request whose prompt plus ``max_tokens`` does not fit it. `ModelWindow`
says how many tokens a call may take; `fit_fields` cuts the user's text substituted into a
prompt (the history first, then the message…) until the call fits, and raises
`ContextWindowExceeded` when the prompt's own wording and the fields it may not cut do not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ..errors import ContextWindowExceeded
from ..tokens.tools import count_messages

if TYPE_CHECKING:
    from ..prompts import Prompt
    from ..tokens.base import TokenCounter
    from ..types import ChatMessage

__all__ = ["Cut", "ModelWindow", "fit_fields", "usable_tokens"]

Cut = tuple[str, Literal["head", "tail"]]
"""A field that may be cut to fit, and which end of it is kept (``tail``: the newest lines)."""


def usable_tokens(context_window: int) -> int:
    """Tokens of ``context_window`` one call may take: a margin of 2 % (at least 16 tokens) is
    left for what a server's chat template adds and for a counter's small misses."""
    return context_window - max(16, context_window // 50)


@dataclass(frozen=True, kw_only=True)
class ModelWindow:
    """The context window of the model a processor calls, and the counter that measures it."""

    tokens: int
    """The model's context window (``EngineSettings.context_window``)."""
    counter: TokenCounter
    """Counts the prompt (the engine's counter: the server's tokenizer where it has one)."""

    def cost(self, messages: Sequence[ChatMessage], max_tokens: int | None) -> int:
        """Tokens a call takes of the window: the request plus the output it allows."""
        return count_messages(self.counter, messages) + (max_tokens or 0)

    def surely_fits(self, messages: Sequence[ChatMessage], max_tokens: int | None) -> bool:
        """True without counting when even one token per UTF-8 byte fits (a byte-level or
        byte-fallback tokenizer never makes more), so a short call costs no count."""
        upper = sum(len(m.content.encode()) + 8 for m in messages) + 8 + (max_tokens or 0)
        return upper <= usable_tokens(self.tokens)


def _cut(text: str, chars: int, keep: Literal["head", "tail"]) -> str:
    if chars >= len(text):
        return text
    return text[:chars].rstrip() + "…" if keep == "head" else "…" + text[len(text) - chars:].lstrip()


def fit_fields(
    window: ModelWindow, prompt: Prompt, fields: Mapping[str, str | int], *, chinese: bool,
    max_tokens: int | None, cuts: Sequence[Cut] = (),
) -> dict[str, str | int]:
    """``fields`` with the ``cuts`` fields shortened, in order, until the call fits ``window``.

    Each field is cut only as far as needed (the longest text that fits, found by bisection),
    and only when the fields before it were not enough. Raises `ContextWindowExceeded` with the
    numbers when the call does not fit even with every one of them emptied.
    """
    fitted = dict(fields)
    limit = usable_tokens(window.tokens)

    def cost(values: Mapping[str, str | int]) -> int:
        return window.cost(prompt.render(chinese=chinese, **values), max_tokens)

    if window.surely_fits(prompt.render(chinese=chinese, **fitted), max_tokens) or cost(fitted) <= limit:
        return fitted
    for name, keep in cuts:
        text = str(fitted[name])
        if cost(fitted | {name: _cut(text, 0, keep)}) > limit:
            fitted[name] = _cut(text, 0, keep)  # not enough on its own: cut it all, then the next
            continue
        low, high = 0, len(text)
        while low < high:
            mid = (low + high + 1) // 2
            low, high = (mid, high) if cost(fitted | {name: _cut(text, mid, keep)}) <= limit else (low, mid - 1)
        fitted[name] = _cut(text, low, keep)
        return fitted
    raise ContextWindowExceeded(
        f"the {prompt.tag} call takes {cost(fitted)} tokens (its max_tokens {max_tokens or 0} included) "
        f"of a {window.tokens}-token context window, {limit} usable"
    )
