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
from ..processors.intents import is_chinese
from ..types import Constraint, Turn

__all__ = ["context_table", "prepared_panel", "token_bar", "turns_table"]

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
        head.append("\nrewritten: ", style="bold")
        head.append(prepared.rewrite.text, style="blue")
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
    table = Table(title="turns", title_justify="left")
    for col in ("seq", "role", "tokens", "emotion", "content"):
        table.add_column(col, justify="right" if col in ("seq", "tokens", "emotion") else "left")
    for t in turns:
        text = tool_sentence(t, zh=is_chinese(t.content[:200])) if t.tool_calls or t.role == "tool" else t.content
        content = text if len(text) < 80 else text[:77] + "…"
        if t.seq in pinned:
            content += f"  📌 {pinned[t.seq]}"
        if t.partial:
            content += "  (partial)"
        table.add_row(
            str(t.seq), t.role, str(t.tokens), "" if t.emotion is None else f"{t.emotion:.2f}", content
        )
    return table
