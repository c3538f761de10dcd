"""Rich views shared by the CLI commands: layers with token bars, turns, constraints."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..assembly import Context
from ..assembly.agent import tool_sentence
from ..engine import PreparedTurn
from ..text.lang import is_chinese
from ..trace import RecalledTurn, TurnTrace
from ..types import Constraint, Turn

__all__ = ["context_table", "prepared_panel", "token_bar", "trace_panel", "turns_table"]

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


def context_table(context: Context) -> Table:
    """One row per layer: tokens used of allocated, a bar, items, dropped turns."""
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
        dropped = ", ".join(str(s) for s in account.dropped_seqs[:8])
        if len(account.dropped_seqs) > 8:
            dropped += f" … (+{len(account.dropped_seqs) - 8})"
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
    parts.append(context_table(prepared.context))
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
    table = Table(title="turns (turn n = the n-th user message)", title_justify="left")
    for col in ("turn", "seq", "role", "tokens", "emotion", "content"):
        table.add_column(col, justify="right" if col in ("turn", "seq", "tokens", "emotion") else "left")
    for t in turns:
        text = tool_sentence(t, zh=is_chinese(t.content[:200])) if t.tool_calls or t.role == "tool" else t.content
        content = text if len(text) < 80 else text[:77] + "…"
        if t.seq in pinned:
            content += f"  📌 {pinned[t.seq]}"
        if t.partial:
            content += "  (partial)"
        number = t.metadata.get("turn")
        table.add_row(
            str(number) if isinstance(number, int) and number else "", str(t.seq), "notice" if t.notice else t.role, str(t.tokens), "" if t.emotion is None else f"{t.emotion:.2f}", content
        )
    return table


def trace_panel(trace: TurnTrace) -> Panel:
    """A kept turn: what was typed, what was sent, the layers, and the messages received."""
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
            ", ".join(str(s) for s in layer.dropped_seqs[:8]),
        )
    parts: list[object] = [head, layers]
    for pin in trace.pins:
        parts.append(Text(f"📌 {pin.value} (from seq {pin.source_seq})", style="magenta"))
    for hit in trace.recalled:
        parts.append(Text(f"↩ seq {hit.seq} ({hit.layer}: {hit.why}{_recall_detail(hit)})", style="yellow"))
    parts.append(Text("messages received:", style="bold"))
    for m in trace.messages:
        parts.append(Text(f"[{m.role}] ", style="bold").append(m.content, style=""))
    title = f"turn {trace.turn} (seq {trace.user_seq}) as the model received it"
    return Panel(Group(*parts), title=title, title_align="left")  # type: ignore[arg-type]


def _recall_detail(hit: RecalledTurn) -> str:
    """Score, ranker, matched terms and neighbour of a recalled turn, as one short clause."""
    parts = []
    if hit.score is not None:
        parts.append(f"{'intensity' if hit.layer == 'key_moments' else hit.ranker or 'score'} {hit.score:g}")
    if hit.matched:
        parts.append(f"matched {', '.join(hit.matched)}")
    if hit.neighbour_of is not None:
        side = "the turn before" if hit.seq < hit.neighbour_of else "the answer after"
        parts.append(f"{side} seq {hit.neighbour_of}")
    return f"; {'; '.join(parts)}" if parts else ""
