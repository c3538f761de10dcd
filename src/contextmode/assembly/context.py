"""The assembled context: layers with their items, and the per-layer token accounting."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from ..memory.budget import LayerName
from ..types import Role, ToolCall

__all__ = ["Context", "LayerAccount", "LayerContent", "LayerItem", "PromptFormat"]

PromptFormat = Literal["messages", "text"]


@dataclass(frozen=True, kw_only=True)
class LayerItem:
    """One piece of a layer: a turn, a constraint, the summary, an instruction."""

    text: str
    """The text as rendered inside its layer (a turn's content verbatim in message form)."""
    tokens: int
    """Tokens this item costs in the chosen format, overhead included."""
    seq: int | None = None
    """The turn it is (turns) or came from (constraints); ``None`` otherwise."""
    role: Role | None = None
    """For turns: who spoke."""
    created_at: datetime | None = None
    """For turns: when."""
    truncated: bool = False
    """True when only the newest part of the text fitted, or a tool result was
    elided to a head/tail excerpt."""
    tool_calls: tuple[ToolCall, ...] = ()
    """For an assistant turn: the tool calls sent with it."""
    tool_call_id: str | None = None
    """For a ``tool`` turn: the call it answers."""


@dataclass(frozen=True, kw_only=True)
class LayerContent:
    """A layer as it will be rendered."""

    name: LayerName
    title: str
    """Heading shown to the model (localised)."""
    items: Sequence[LayerItem] = ()
    rendered: str = ""
    """The section as the model sees it (empty for recent turns sent as messages)."""


@dataclass(frozen=True, kw_only=True)
class LayerAccount:
    """Token accounting of one layer."""

    name: LayerName
    allocated: int
    """The layer's share of the input budget: its nominal share (fixed allocation or
    weighted share), or more when budget other layers did not use flowed to it."""
    used: int
    """Tokens the layer actually costs in the rendered output (heading and delimiters included)."""
    items: int = 0
    """How many items made it in."""
    dropped_seqs: Sequence[int] = ()
    """Candidate turns (or constraints' turns) left out for lack of budget."""
    truncated: bool = False
    """True when an item was cut to fit."""


@dataclass(frozen=True, kw_only=True)
class Context:
    """Exactly what the model receives, and how the budget was spent."""

    layers: Sequence[LayerContent]
    """Non-empty layers in prompt order."""
    accounts: Mapping[LayerName, LayerAccount]
    """Accounting for every layer considered, empty ones included."""
    message: str
    """The current message as sent (the standalone rewrite when there is one)."""
    original_message: str
    """The message as the user typed it."""
    format: PromptFormat
    locale: str
    strategy: str
    input_budget: int
    """Tokens available for the input (window minus reply reserve)."""
    reply_reserve: int
    total_tokens: int
    """Tokens of the whole rendered input, chat-format overhead included."""
    exact: bool
    """True when counted with the model's own tokenizer; False for an estimate."""
    counter: str
    """Token counter name."""
    order: Sequence[LayerName] = field(default_factory=tuple)
    hint: str | None = None
    """A verified rewrite shown to the model as a labelled hint (contextual mode), if any."""
    steady: bool = False
    """True when the window was kept steady (`MemoryPlan.steady_from`): the summary leaves its
    turns alone until it drops them."""

    def layer(self, name: LayerName) -> LayerContent | None:
        """The rendered layer ``name``, or ``None`` when it is empty."""
        return next((layer for layer in self.layers if layer.name == name), None)

    @property
    def dropped_seqs(self) -> tuple[int, ...]:
        """All candidate turns left out, across layers."""
        return tuple(sorted({s for a in self.accounts.values() for s in a.dropped_seqs}))

    def summary_line(self) -> str:
        """One line for logs: total and per-layer used/allocated tokens."""
        parts = [f"{a.name}={a.used}/{a.allocated}" for a in self.accounts.values() if a.used or a.allocated]
        flag = "" if self.exact else " (estimated)"
        return f"tokens={self.total_tokens}/{self.input_budget}{flag} " + " ".join(parts)
