"""Agent items in assembly: tool calls and their results, kept whole as units.

The invariants (``docs/agents.md``): an assistant turn that made tool calls and
the ``tool`` turns that answer them form one *unit* that is kept or dropped
together and in order; a result whose call is not in the window, and a call
whose results are missing, never reach the model as such (the call's text stays,
its calls go). Big results of older units are elided to a head/tail excerpt
with a marker naming the stored turn (the whole result stays in the store,
reachable by recall); per-tool limits decide how big is big.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from ..text import is_chinese
from ..tokens.base import TokenCounter
from ..tokens.tools import count_turn, message_overhead
from ..types import ToolCall, Turn

__all__ = [
    "DEFAULT_TOOL_RESULT_TOKENS",
    "AgentItem",
    "ToolLimits",
    "agent_units",
    "as_sentence",
    "elide",
    "item_cost",
    "split_step",
    "tool_sentence",
]

DEFAULT_TOOL_RESULT_TOKENS = 1000
"""Tokens an older tool result keeps (head and tail) unless a per-tool limit says otherwise."""


@dataclass(frozen=True, kw_only=True)
class ToolLimits:
    """How much of an older tool result reaches the model, in tokens."""

    default: int = DEFAULT_TOOL_RESULT_TOKENS
    """Limit for a tool without its own."""
    per_tool: Mapping[str, int] = field(default_factory=dict)
    """Limits by tool (function) name."""

    def limit(self, tool: str | None) -> int:
        return self.per_tool.get(tool or "", self.default)


@dataclass(frozen=True, kw_only=True)
class AgentItem:
    """One turn as it will be shown: its text (possibly elided) and, kept or not, its calls."""

    turn: Turn
    text: str
    """The content as sent (an excerpt when ``elided``)."""
    tool_calls: tuple[ToolCall, ...] = ()
    """The calls sent with it (empty when its results are missing)."""
    tool_call_id: str | None = None
    elided: bool = False
    group: int = 0
    """Sequence number of the unit's first turn: a unit is kept or dropped as a whole."""


def _is_call(turn: Turn) -> bool:
    return turn.role == "assistant" and bool(turn.tool_calls)


def agent_units(turns: Sequence[Turn]) -> list[list[Turn]]:
    """Split ``turns`` (oldest first) into units: a plain turn alone, or a call turn with the
    results that answer it. Results without their call are left out; a call turn whose
    results are not all there becomes a plain turn (`AgentItem` drops its calls)."""
    units: list[list[Turn]] = []
    open_ids: set[str] = set()
    for turn in turns:
        if turn.role == "tool":
            if open_ids and turn.tool_call_id in open_ids:
                units[-1].append(turn)
                open_ids.discard(turn.tool_call_id or "")
            continue  # an orphan result: its call is outside the window or was never made
        open_ids = {c.id for c in turn.tool_calls} if _is_call(turn) else set()
        units.append([turn])
    return units


def _complete(unit: Sequence[Turn]) -> bool:
    head = unit[0]
    if not _is_call(head):
        return True
    answered = {t.tool_call_id for t in unit[1:]}
    return all(c.id in answered for c in head.tool_calls)


def _longest(text: str, max_tokens: int, count: Callable[[str], int], *, tail: bool, chars_per_token: float) -> str:
    """A near-longest prefix (or suffix) of ``text`` within ``max_tokens``: searched in a
    window sized from the text's own characters per token, to within 2 %."""
    if max_tokens <= 0:
        return ""
    size = min(len(text), int(max_tokens * chars_per_token * 1.5) + 32)

    def part(n: int) -> str:
        return text[len(text) - n :] if tail else text[:n]

    if count(part(size)) <= max_tokens:
        return part(size)
    lo, hi = 0, size  # part(lo) fits, part(hi) does not
    while hi - lo > max(1, hi // 50):
        mid = (lo + hi) // 2
        if count(part(mid)) <= max_tokens:
            lo = mid
        else:
            hi = mid
    return part(lo)


_EXCERPTS: OrderedDict[tuple[int, int, int, int, int, int, bool], str] = OrderedDict()
_EXCERPTS_MAX = 4096
_EXCERPTS_LOCK = threading.Lock()


def elide(text: str, tokens: int, max_tokens: int, count: Callable[[str], int], *, seq: int, zh: bool) -> str:
    """A head/tail excerpt of ``text`` (``tokens`` long) within ``max_tokens``, with a marker
    saying how much was left out and which stored turn holds it whole; ``text`` if it fits.

    Cached by the text's hash, never the text itself (a 50k-token result is not pinned in
    memory): the same old result is elided the same way at every turn."""
    if tokens <= max_tokens:
        return text
    key = (hash(text), len(text), tokens, max_tokens, id(count), seq, zh)
    with _EXCERPTS_LOCK:
        cached = _EXCERPTS.get(key)
        if cached is not None:
            _EXCERPTS.move_to_end(key)
            return cached
    excerpt = _excerpt(text, tokens, max_tokens, count, seq=seq, zh=zh)
    with _EXCERPTS_LOCK:
        _EXCERPTS[key] = excerpt
        if len(_EXCERPTS) > _EXCERPTS_MAX:
            _EXCERPTS.popitem(last=False)
    return excerpt


def _excerpt(text: str, tokens: int, max_tokens: int, count: Callable[[str], int], *, seq: int, zh: bool) -> str:
    marker = (
        f"\n[…已省略约 {tokens} 个词元中的大部分；完整结果保存在第 {seq} 轮…]\n"
        if zh
        else f"\n[… most of {tokens} tokens elided; the whole result is stored as turn {seq} …]\n"
    )
    room = max_tokens - count(marker) - 2  # two tokens of slack for the joins
    if room <= 0:  # no room for an excerpt: the shortest marker that still points at the turn
        return f"[…已省略 {tokens} 词元，见第 {seq} 轮]" if zh else f"[… {tokens} tokens elided, see turn {seq}]"
    ratio = max(1.0, len(text) / max(1, tokens))
    head = _longest(text, room * 2 // 3, count, tail=False, chars_per_token=ratio)
    tail = _longest(text[len(head) :], room - count(head), count, tail=True, chars_per_token=ratio)
    return head + marker + tail


def _item(turn: Turn, group: int, keep_calls: bool, limit: int | None, count: Callable[[str], int], zh: bool) -> AgentItem:
    text = turn.content
    if limit is not None and turn.role == "tool":
        text = elide(text, turn.tokens, limit, count, seq=turn.seq, zh=zh)
    return AgentItem(
        turn=turn,
        text=text,
        tool_calls=turn.tool_calls if keep_calls else (),
        tool_call_id=turn.tool_call_id,
        elided=text != turn.content,
        group=group,
    )


def unit_items(
    unit: Sequence[Turn], *, limits: ToolLimits | None, count: Callable[[str], int], zh: bool
) -> list[AgentItem]:
    """The items of one unit; results elided to ``limits`` (``None`` = whole)."""
    group = unit[0].seq
    if not _complete(unit):
        # Results missing: the call turn alone, without its calls, and only if it said something.
        head = unit[0]
        return [_item(head, group, False, None, count, zh)] if head.content.strip() else []
    tool_names = {c.id: c.name for c in unit[0].tool_calls}
    items = []
    for turn in unit:
        limit = limits.limit(turn.tool_name or tool_names.get(turn.tool_call_id or "")) if limits else None
        items.append(_item(turn, group, True, limit, count, zh))
    return items


def item_cost(item: AgentItem, counter: TokenCounter, count: Callable[[str], int]) -> int:
    """Tokens of ``item`` as one chat message, overhead included (stored count when unchanged)."""
    turn = item.turn
    overhead = message_overhead(counter, turn.role)
    if not item.elided and item.text == turn.content and item.tool_calls == turn.tool_calls:
        return turn.tokens + overhead
    if turn.role == "tool":
        return count_turn(_Counting(counter, count), item.text, tool_result=True) + overhead
    return count_turn(_Counting(counter, count), item.text, tool_calls=item.tool_calls) + overhead


class _Counting:
    """``counter`` with its ``count`` replaced by a cached one (same numbers, fewer calls)."""

    def __init__(self, counter: TokenCounter, count: Callable[[str], int]) -> None:
        self.name = counter.name
        self.exact = counter.exact
        self.message_overhead = counter.message_overhead
        self.reply_overhead = counter.reply_overhead
        self._count = count

    def count(self, text: str) -> int:
        return self._count(text)


def split_step(turns: Sequence[Turn]) -> tuple[list[Turn], Turn | None, list[Turn]]:
    """``(history, latest user turn, agent step)``: the step is what followed the latest
    user turn (the model's calls and their results) when the log does not end with it."""
    for i in range(len(turns) - 1, -1, -1):
        if turns[i].role == "user":
            return list(turns[:i]), turns[i], list(turns[i + 1 :])
    return list(turns), None, []


def iter_items(
    units: Sequence[Sequence[Turn]], *, limits: ToolLimits | None, count: Callable[[str], int], zh: bool
) -> Iterator[AgentItem]:
    for unit in units:
        yield from unit_items(unit, limits=limits, count=count, zh=zh)


def _arguments_phrase(arguments: str, limit: int = 80) -> str:
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments[:limit]
    if isinstance(value, dict):
        text = ", ".join(f"{k} {_scalar(v)}" for k, v in value.items())
    else:
        text = _scalar(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _scalar(value: object) -> str:
    if isinstance(value, str):
        return f"“{value}”"
    if isinstance(value, list | dict):
        return f"{len(value)} items" if isinstance(value, list) else "an object"
    return str(value)


def tool_sentence(turn: Turn, *, zh: bool, result_chars: int = 160, name: str | None = None) -> str:
    """What an agent item did, as one sentence and never raw JSON: ``Called search with
    query “x”.`` or ``search returned: <the start of the result>``. Empty for plain turns."""
    if _is_call(turn):
        calls = [f"{c.name}({_arguments_phrase(c.arguments)})" for c in turn.tool_calls]
        said = turn.content.strip()
        lead = ("调用了 " if zh else "Called ") + ("、" if zh else ", ").join(calls) + ("。" if zh else ".")
        return f"{said} {lead}".strip() if said else lead
    if turn.role == "tool":
        tool = name or turn.tool_name or ("工具" if zh else "the tool")
        body = " ".join(turn.content.split())
        if body.startswith(("{", "[")):
            body = _arguments_phrase(body, result_chars)
        body = body if len(body) <= result_chars else body[: result_chars - 1] + "…"
        return f"{tool} 返回：{body}" if zh else f"{tool} returned: {body}"
    return ""


def step_items(
    step: Sequence[Turn],
    room: int,
    *,
    counter: TokenCounter,
    count: Callable[[str], int],
    zh: bool,
) -> tuple[list[AgentItem], int]:
    """The current agent step (calls and results after the latest user turn) within ``room``
    tokens: whole when it fits, else every result cut to the largest common limit that fits
    (at least a marker each). Returns the items and their cost; the cost may exceed ``room``
    when not even the markers fit (the caller reports the message as too large)."""
    units = agent_units(step)

    def build(limit: int | None) -> tuple[list[AgentItem], int]:
        limits = None if limit is None else ToolLimits(default=limit)
        items = list(iter_items(units, limits=limits, count=count, zh=zh))
        return items, sum(item_cost(i, counter, count) for i in items)

    items, cost = build(None)
    if cost <= room:
        return items, cost
    floor = build(0)
    if floor[1] > room:
        return floor
    # The largest common limit whose excerpts fit (water-filling on the stored counts), then
    # checked with the exact counter and lowered by the overshoot until it fits.
    sizes = sorted(i.turn.tokens for i in items if i.turn.role == "tool")
    spare = room - sum(item_cost(i, counter, count) - i.turn.tokens for i in items if i.turn.role == "tool") \
        - sum(item_cost(i, counter, count) for i in items if i.turn.role != "tool")
    limit = _water_level(sizes, spare)
    for _ in range(8):
        if limit <= 0:
            break
        candidate = build(limit)
        if candidate[1] <= room:
            return candidate
        limit -= (candidate[1] - room) // max(1, len(sizes)) + 1
    return floor


def _water_level(sizes: Sequence[int], total: int) -> int:
    """The largest ``level`` with ``sum(min(size, level)) <= total`` (``sizes`` ascending)."""
    remaining = total
    for i, size in enumerate(sizes):
        share = remaining // (len(sizes) - i)
        if size > share:
            return max(0, share)
        remaining -= size
    return sizes[-1] if sizes else 0


def as_sentence(turn: Turn) -> Turn:
    """``turn`` with an agent item's content replaced by its `tool_sentence` (for summarisers:
    a summary says what was called and what came back, never raw JSON); others unchanged."""
    if turn.role != "tool" and not turn.tool_calls:
        return turn
    return replace(turn, content=tool_sentence(turn, zh=is_chinese(turn.content[:200])), metadata={}, tool_calls=(),
                   tool_call_id=None, tool_name=None)
