"""Rich views shared by the CLI commands: layers with token bars, turns, constraints."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..assembly import Context
from ..assembly.agent import tool_sentence
from ..engine import PreparedTurn
from ..store.base import Store
from ..store.records import RecalledTurn, TurnTrace, TurnUsage
from ..text.lang import is_chinese
from ..types import Constraint, SessionKey, Turn

__all__ = [
    "Numbering",
    "context_table",
    "load_numbering",
    "prepared_panel",
    "token_bar",
    "trace_panel",
    "trace_seqs",
    "turns_table",
]


class Numbering:
    """The one numbering the CLI shows: a stored turn by its exchange ("turn 3" for the third
    user message, "turn 3's answer" for what came back), as the API's ``turn`` and the page
    do; a turn stored without one (older data) is "message <seq>"."""

    def __init__(self, turns: Iterable[Turn] = ()) -> None:
        self._by_seq: dict[int, tuple[int, str]] = {}
        for turn in turns:
            number = turn.metadata.get("turn")
            if isinstance(number, int) and number > 0:
                self._by_seq[turn.seq] = (number, turn.role)

    def label(self, seq: int) -> str:
        """``turn 3``, ``turn 3's answer`` (``turn 3's tool result``), or ``message 12``."""
        known = self._by_seq.get(seq)
        if known is None:
            return f"message {seq}"
        number, role = known
        if role == "user":
            return f"turn {number}"
        return f"turn {number}'s {'answer' if role == 'assistant' else role}"

    def labels(self, seqs: Sequence[int], most: int = 8) -> str:
        """The first ``most`` of ``seqs`` labelled, then how many more."""
        text = ", ".join(self.label(s) for s in seqs[:most])
        return text + (f" … (+{len(seqs) - most})" if len(seqs) > most else "")

    def through(self, seq: int) -> str:
        """``turns 1–3``: the exchanges up to stored turn ``seq`` (a summary's cover)."""
        known = self._by_seq.get(seq)
        return f"turns 1–{known[0]}" if known else f"messages 1–{seq}"


async def load_numbering(store: Store, key: SessionKey, seqs: Iterable[int]) -> Numbering:
    """The numbering of the stored turns ``seqs`` refer to (one read of their range)."""
    wanted = [s for s in seqs if s > 0]
    if not wanted:
        return Numbering()
    return Numbering(await store.turns(key, from_seq=min(wanted), to_seq=max(wanted)))

_COLORS = {
    "system": "bright_black",
    "constraints": "magenta",
    "summary": "cyan",
    "key_moments": "red",
    "recall": "yellow",
    "recent": "green",
    "current": "blue",
    "format": "bright_black",
}


def token_bar(used: int, allocated: int, width: int = 16, color: str = "green") -> Text:
    """``████░░░░`` with ``used`` of ``allocated`` tokens filled."""
    allocated = max(allocated, used, 1)
    filled = round(width * used / allocated)
    bar = Text("█" * filled, style=color)
    bar.append("░" * (width - filled), style="bright_black")
    return bar


def context_table(context: Context, numbering: Numbering | None = None) -> Table:
    """One row per layer: tokens used of allocated, a bar, items, dropped turns."""
    numbering = numbering or Numbering()
    flag = "" if context.exact else " (estimated)"
    table = Table(
        title=f"{context.total_tokens} / {context.input_budget} tokens{flag} · {context.counter} · "
        f"{context.strategy} · reply reserve {context.reply_reserve}",
        title_justify="left",
    )
    table.add_column("layer")
    table.add_column("used/alloc", justify="right")
    table.add_column("")
    table.add_column("items", justify="right")
    table.add_column("dropped turns")
    for name in context.order:
        account = context.accounts.get(name)
        if account is None:
            continue
        dropped = numbering.labels(account.dropped_seqs)
        table.add_row(
            Text(name, style=_COLORS.get(name, "")),
            f"{account.used}/{account.allocated}",
            token_bar(account.used, account.allocated, color=_COLORS.get(name, "green")),
            str(account.items),
            dropped + (" ✂" if account.truncated else ""),
        )
    return table


def prepared_panel(prepared: PreparedTurn, *, show_messages: bool = False) -> Panel:
    """The detection, the rewrite and the layer table of a prepared turn."""
    parts: list[object] = []
    det = prepared.detection
    head = Text()
    head.append("needs context: ", style="bold")
    head.append("yes" if det.needs_context else "no")
    if det.intent:
        head.append(f" · intent: {det.intent}")
    if prepared.rewrite is not None and prepared.rewrite.changed:
        # Contextual mode sends the message verbatim and the verified rewrite as a hint.
        label = "sent instead (verified): " if prepared.mode == "decoupled" else "hint (verified rewrite): "
        head.append("\n" + label, style="bold")
        head.append(prepared.rewrite.text, style="blue")
    if prepared.rejected_rewrite is not None:
        head.append("\nrewrite rejected: ", style="bold")
        head.append(f"{prepared.rejected_rewrite.text} ({prepared.rejected_rewrite.reason})", style="bright_black")
    head.append(f"\nmode: {prepared.mode} · prepared in {prepared.prepare_ms:.1f} ms")
    parts.append(head)
    state = prepared.state
    parts.append(context_table(prepared.context, Numbering((*state.turns, *state.recalled, *state.key_moments))))
    if show_messages:
        for m in prepared.messages:
            line = Text(f"[{m.role}] ", style="bold").append(m.content, style="")
            if m.tool_calls:
                line.append(" → " + ", ".join(f"{c.name}({c.arguments})" for c in m.tool_calls), style="magenta")
            if m.tool_call_id:
                line = Text(f"[tool {m.tool_call_id}] ", style="bold").append(m.content[:200], style="")
            parts.append(line)
    return Panel(Group(*parts), title=f"context for: {prepared.context.original_message[:40]}", title_align="left")  # type: ignore[arg-type]


def turns_table(turns: Sequence[Turn], constraints: Sequence[Constraint] = ()) -> Table:
    """Stored turns with their tokens and emotion; pinned constraints marked by source turn."""
    pinned = {c.source_seq: c.value for c in constraints}
    table = Table(title="turns (turn n = the n-th user message and its answer)", title_justify="left")
    for col in ("turn", "role", "tokens", "emotion", "content"):
        table.add_column(col, justify="right" if col in ("turn", "tokens", "emotion") else "left")
    for t in turns:
        text = tool_sentence(t, zh=is_chinese(t.content[:200])) if t.tool_calls or t.role == "tool" else t.content
        content = text if len(text) < 80 else text[:77] + "…"
        if t.seq in pinned:
            content += f"  📌 {pinned[t.seq]}"
        if t.partial:
            content += "  (partial)"
        number = t.metadata.get("turn")
        table.add_row(
            str(number) if isinstance(number, int) and number else "", "notice" if t.notice else t.role, str(t.tokens), "" if t.emotion is None else f"{t.emotion:.2f}", content
        )
    return table


def trace_panel(trace: TurnTrace, numbering: Numbering | None = None) -> Panel:
    """A kept turn: what was typed, what was sent, the layers, the pins as they were then,
    and the messages received (``numbering``: `load_numbering` of `trace_seqs`)."""
    numbering = numbering or Numbering()
    head = Text()
    head.append("typed: ", style="bold")
    head.append(trace.typed)
    if trace.sent != trace.typed:
        head.append("\nsent:  ", style="bold")
        head.append(trace.sent, style="blue")
    if trace.rewrite is not None and trace.rewrite.changed:
        head.append(f"\nrewrite ({trace.rewrite.source}): {trace.rewrite.decision}: {trace.rewrite.text}")
    if trace.follow_up:
        head.append(f"\nfollow-up template: {trace.follow_up}")
    head.append(
        f"\n{trace.total_tokens} / {trace.input_budget} tokens{'' if trace.exact else ' (estimated)'} · "
        f"{trace.counter} · {trace.strategy} · {trace.mode} · model {trace.model}"
    )
    ttft = "-" if trace.ttft_ms is None else f"{trace.ttft_ms:.1f}"
    head.append(f"\nprepare {trace.prepare_ms:.1f} ms · first token {ttft} ms · model {trace.model_ms:.1f} ms")
    if trace.usage is not None:
        head.append(f"\n{usage_text(trace.usage)}")
    if trace.partial:
        head.append("\nthe answer's stream broke: partial answer", style="red")
    layers = Table(title="layers", title_justify="left")
    for col in ("layer", "used/alloc", "", "items", "dropped turns"):
        layers.add_column(col)
    for layer in trace.layers:
        color = _COLORS.get(layer.name, "green")
        layers.add_row(
            Text(layer.name, style=_COLORS.get(layer.name, "")), f"{layer.used}/{layer.allocated}",
            token_bar(layer.used, layer.allocated, color=color), str(layer.items),
            numbering.labels(layer.dropped_seqs),
        )
    parts: list[object] = [head, layers]
    if trace.pins:
        parts.append(Text(f"pinned at turn {trace.turn} (as they were then):", style="bold"))
    for pin in trace.pins:
        parts.append(Text(f"📌 {pin.value} (from {numbering.label(pin.source_seq)})", style="magenta"))
    for hit in trace.recalled:
        parts.append(Text(f"↩ {numbering.label(hit.seq)} ({hit.layer}: {hit.why}{_recall_detail(hit, numbering)})", style="yellow"))
    parts.append(Text("messages received:", style="bold"))
    for m in trace.messages:
        parts.append(Text(f"[{m.role}] ", style="bold").append(m.content, style=""))
    title = f"turn {trace.turn} as the model received it"
    return Panel(Group(*parts), title=title, title_align="left")  # type: ignore[arg-type]


def usage_text(usage: TurnUsage) -> str:
    """A kept turn's cost on one line: input tokens, the cacheable prefix (the part that repeats
    the previous request byte for byte), the cached tokens the endpoint billed, the money."""
    parts = [f"{usage.prompt_tokens} input tokens"]
    if usage.cacheable_tokens is not None:
        share = usage.cacheable_tokens / usage.prompt_tokens if usage.prompt_tokens else 0.0
        parts.append(f"cacheable prefix {usage.cacheable_tokens} ({share:.0%})")
    if usage.cached_tokens is not None:
        parts.append(f"billed as cached {usage.cached_tokens}")
    if usage.usd is not None:
        parts.append(f"${usage.usd:.5f} this turn · ${usage.session_usd or usage.usd:.4f} session ({usage.price_family} prices)")
    return " · ".join(parts)


def trace_seqs(trace: TurnTrace) -> list[int]:
    """The stored turns a kept trace refers to (pins, recalled turns, dropped turns)."""
    seqs = [p.source_seq for p in trace.pins] + [r.seq for r in trace.recalled]
    seqs += [r.neighbour_of for r in trace.recalled if r.neighbour_of is not None]
    return seqs + [s for layer in trace.layers for s in layer.dropped_seqs]


def _recall_detail(hit: RecalledTurn, numbering: Numbering) -> str:
    """Score, ranker, matched terms and neighbour of a recalled turn, as one short clause."""
    parts = []
    if hit.score is not None:
        parts.append(f"{'intensity' if hit.layer == 'key_moments' else hit.ranker or 'score'} {hit.score:g}")
    if hit.matched:
        parts.append(f"matched {', '.join(hit.matched)}")
    if hit.neighbour_of is not None:
        side = "the turn before" if hit.seq < hit.neighbour_of else "the answer after"
        parts.append(f"{side} {numbering.label(hit.neighbour_of)}")
    return f"; {'; '.join(parts)}" if parts else ""
