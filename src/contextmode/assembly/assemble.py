"""Assembly: fit a memory plan into the budget and render it, with exact accounting.

Cost grows with the window, not the history: recent turns are walked back
from the tail using their stored token counts; only the rendered sections
(summary, constraints, moments) are counted, through a small cache.
"""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import lru_cache

from ..errors import ConfigError, MessageTooLarge
from ..memory.budget import FLEXIBLE_LAYERS, Budget, LayerName, allocate
from ..memory.strategies import Strategy, get_strategy
from ..processors.intents import is_chinese
from ..tokens.base import TokenCounter
from ..tokens.tools import message_overhead
from ..types import SessionState, Turn, utc_now
from .agent import (
    AgentItem,
    ToolLimits,
    agent_units,
    item_cost,
    iter_items,
    step_items,
    tool_sentence,
)
from .context import Context, LayerAccount, LayerContent, LayerItem, PromptFormat
from .render import (
    DEFAULT_SYSTEM_PROMPT,
    SECTION_SEPARATOR,
    constraint_line,
    data_text,
    layer_title,
    rewrite_hint,
    role_label,
    section_text,
    turn_line,
)

__all__ = [
    "DEPRECATED_ORDER_NAMES",
    "ESTIMATE_MARGIN",
    "ORDER_PRESETS",
    "AssemblyConfig",
    "assemble",
    "cut_to_tokens",
    "order_preset",
    "paired_turns",
]

ORDER_PRESETS: dict[str, tuple[LayerName, ...]] = {
    # Chronological: background (summary, key moments, recall) first, then the newest turns,
    # the message and the reply instruction (the emotional-companion article's order).
    "default": ("system", "constraints", "summary", "key_moments", "recall", "recent", "current", "format"),
    # The question right after the pinned constraints, then the turns and the summary
    # (the context-manager article's order).
    "question_first": ("system", "constraints", "current", "recent", "summary", "key_moments", "recall", "format"),
}
"""Layer order presets by name (``CONTEXTMODE_ORDER``)."""

DEPRECATED_ORDER_NAMES: dict[str, str] = {"seed001": "default", "seed003": "question_first"}
"""Old preset names, still accepted for one release with a `DeprecationWarning`."""


def order_preset(name: str) -> tuple[LayerName, ...]:
    """The layer order preset ``name`` (`ConfigError` naming the allowed ones if unknown)."""
    if name in DEPRECATED_ORDER_NAMES:
        new = DEPRECATED_ORDER_NAMES[name]
        warnings.warn(f"layer order {name!r} is deprecated; use {new!r}", DeprecationWarning, stacklevel=3)
        name = new
    if name not in ORDER_PRESETS:
        raise ConfigError(f"unknown layer order preset {name!r} (CONTEXTMODE_ORDER); use one of {sorted(ORDER_PRESETS)}")
    return ORDER_PRESETS[name]


@dataclass(frozen=True, kw_only=True)
class AssemblyConfig:
    """How the layers are ordered and rendered."""

    order: Sequence[LayerName] | str = "default"
    """Layer order, or a preset name. In message form the recent turns and the
    current message are always the last messages; the order arranges the rest."""
    format: PromptFormat = "messages"
    """``messages`` (OpenAI-style chat) or ``text`` (one plain prompt with section headings)."""
    locale: str = "auto"
    """``zh``, ``en`` or ``auto`` (Chinese when the message or recent turns are)."""
    system_prompt: str | None = None
    """The system instruction; ``None`` = a default that says data sections are not instructions."""
    reply_format: str = ""
    """Reply-format instructions (the ``format`` layer), empty for none."""
    tool_limits: ToolLimits = field(default_factory=ToolLimits)
    """How many tokens of an older tool result reach the model (head and tail, per tool)."""

    def resolved_order(self) -> tuple[LayerName, ...]:
        order = order_preset(self.order) if isinstance(self.order, str) else tuple(self.order)
        missing = set(ORDER_PRESETS["default"]) - set(order)
        if missing:
            raise ConfigError(f"layer order misses {sorted(missing)}")
        return order


ESTIMATE_MARGIN = 0.05
"""Share of the input budget left unused when token counts are estimates, not exact."""

_COUNT_CACHES: dict[int, tuple[TokenCounter, Callable[[str], int]]] = {}


_LONG_TEXT = 2048
"""Texts longer than this (characters) are cached by hash and length, never pinned in memory."""


def _cached_count(counter: TokenCounter) -> Callable[[str], int]:
    """``counter.count`` behind an LRU cache (sections repeat from turn to turn).

    Short texts are cached by value; a long one (a tool result of 50k tokens) by its hash
    and length, so the cache never holds megabytes of old results alive."""
    entry = _COUNT_CACHES.get(id(counter))
    if entry is None or entry[0] is not counter:
        short = lru_cache(maxsize=8192)(counter.count)
        long_counts: OrderedDict[tuple[int, int], int] = OrderedDict()
        lock = threading.Lock()

        def count(text: str) -> int:
            if len(text) <= _LONG_TEXT:
                return short(text)
            key = (hash(text), len(text))
            with lock:
                known = long_counts.get(key)
                if known is not None:
                    long_counts.move_to_end(key)
                    return known
            tokens = counter.count(text)
            with lock:
                long_counts[key] = tokens
                if len(long_counts) > 1024:
                    long_counts.popitem(last=False)
            return tokens

        entry = (counter, count)
        _COUNT_CACHES[id(counter)] = entry
    return entry[1]


def cut_to_tokens(text: str, max_tokens: int, count: Callable[[str], int]) -> str:
    """The longest suffix of ``text`` (prefixed with "…") that fits ``max_tokens``.

    Keeps the newest part of a turn that cannot fit whole (seed 001); ``""``
    when not even the ellipsis fits.
    """
    if count(text) <= max_tokens:
        return text
    lo, hi = 1, len(text)  # search the smallest start index that fits
    best = ""
    while lo <= hi:
        mid = (lo + hi) // 2
        candidate = "…" + text[mid:]
        if count(candidate) <= max_tokens:
            best, hi = candidate, mid - 1
        else:
            lo = mid + 1
    return best


def _locale(config: AssemblyConfig, message: str, state: SessionState) -> str:
    if config.locale != "auto":
        return config.locale
    if is_chinese(message) or any(is_chinese(t.content) for t in state.turns[-4:]):
        return "zh"
    return "en"


@dataclass
class _Candidate:
    line: str
    cost: int
    seq: int | None
    turn: Turn | None = None
    day: str | None = None
    """Recall: the day heading this turn is shown under (one heading per day, not per line)."""
    day_cost: int = 0
    item: AgentItem | None = None
    """Recent turns: the turn as shown (tool calls, elided result)."""
    group: int | None = None
    """Recent turns: the unit (a call and its results) kept or dropped as a whole."""


def paired_turns(turns: Sequence[Turn]) -> list[Turn]:
    """``turns`` oldest first, each assistant answer moved right after the user message it
    answers (``reply_to`` in its metadata), so ``user, user, answer, answer`` becomes
    ``user, answer, user, answer``.

    Sessions written before turns of one session were serialised may hold such
    interleaved runs; an answer whose question is not among ``turns`` keeps its place.
    """
    ordered = sorted(turns, key=lambda t: t.seq)
    questions = {t.seq for t in ordered if t.role == "user"}
    answers: dict[int, list[Turn]] = {}
    moved: set[int] = set()
    for t in ordered:
        reply_to = t.metadata.get("reply_to") if t.role == "assistant" else None
        if isinstance(reply_to, int) and reply_to in questions and reply_to < t.seq:
            answers.setdefault(reply_to, []).append(t)
            moved.add(t.seq)
    result: list[Turn] = []
    for t in ordered:
        if t.seq in moved:
            continue
        result.append(t)
        result.extend(answers.get(t.seq, ()))
    return result


def assemble(
    state: SessionState,
    message: str,
    *,
    counter: TokenCounter,
    strategy: str | Strategy = "default",
    budget: Budget | None = None,
    config: AssemblyConfig | None = None,
    now: datetime | None = None,
    standalone: str | None = None,
    hint: str | None = None,
    agent_step: Sequence[Turn] = (),
) -> Context:
    """Build exactly what the model receives for ``message``, inside ``budget``.

    ``standalone`` is the rewritten question when the message needed context;
    it replaces the message as sent (decoupled mode). ``hint`` is a verified rewrite shown
    as a labelled hint after the system prompt while the message is sent verbatim
    (contextual mode). ``agent_step`` holds the tool calls and results that followed
    ``message`` (an agent loop's current step): they come after it, always present, their
    results cut only when the whole step does not fit. Raises `MessageTooLarge` when the
    message alone does not fit the input budget.
    """
    strategy = get_strategy(strategy)
    budget = budget or Budget()
    config = config or AssemblyConfig()
    order = config.resolved_order()
    now = now or utc_now()
    locale = _locale(config, message, state)
    lang = "zh" if locale.startswith("zh") else "en"
    count = _cached_count(counter)
    overhead = counter.message_overhead
    sep_cost = count(SECTION_SEPARATOR)
    as_messages = config.format == "messages"
    plan = strategy.plan(state, message, now=now)
    sent = standalone or message
    # An estimate can be a few per cent low (docs/tokens.md: Chinese sums −2.6…−4.6 %):
    # keep a margin so the real count stays inside the window too.
    input_budget = budget.input_tokens if counter.exact else int(budget.input_tokens * (1 - ESTIMATE_MARGIN))

    # Layers that are always whole: the current message, the system prompt, the reply format.
    if as_messages:
        current_text = sent
        current_cost = count(sent) + message_overhead(counter, "user") + counter.reply_overhead
    else:
        current_text = section_text("current", layer_title("current", locale), [f"{role_label('user', locale)}: {sent}"])
        current_cost = count(current_text) + sep_cost
    if current_cost > input_budget:
        raise MessageTooLarge(current_cost, input_budget)
    system_text = DEFAULT_SYSTEM_PROMPT[lang] if config.system_prompt is None else config.system_prompt
    fixed_sections: dict[LayerName, str] = {}
    if hint and hint.strip() != sent.strip():
        system_text = "\n\n".join(p for p in (system_text, rewrite_hint(hint, locale)) if p)
    if system_text:
        fixed_sections["system"] = section_text("system", "", [system_text])
    if config.reply_format:
        fixed_sections["format"] = section_text("format", layer_title("format", locale), [config.reply_format])
    fixed_costs = {name: count(text) + sep_cost for name, text in fixed_sections.items()}
    system_message_overhead = message_overhead(counter, "system") if as_messages else 0
    available = input_budget - current_cost - sum(fixed_costs.values()) - system_message_overhead
    shape = _Shape(counter=counter, count=count, locale=locale, as_messages=as_messages)
    step, step_cost, current_text = _current_step(
        agent_step, available, _pins_reserve(state, count, locale, sep_cost, available), shape, sent, current_text
    )
    current_cost += step_cost
    available -= step_cost
    if available < 0:
        raise MessageTooLarge(current_cost + sum(fixed_costs.values()), input_budget)

    # Candidates and their costs, per flexible layer.
    candidates: dict[LayerName, list[_Candidate]] = {name: [] for name in FLEXIBLE_LAYERS}
    for c in reversed(state.constraints):  # newest first: they win when space is short
        line = constraint_line(c)
        candidates["constraints"].append(_Candidate(line, count(line) + 1, c.source_seq))
    if plan.summary is not None and plan.summary.text.strip():
        text = data_text(plan.summary.text.strip())
        candidates["summary"].append(_Candidate(text, count(text) + 1, None))
    dated_layers: tuple[tuple[LayerName, Sequence[Turn], bool], ...] = (
        ("key_moments", plan.key_moments, False),
        ("recall", plan.recall, True),
    )
    for name, turns, dated in dated_layers:
        for t in turns:
            if dated:
                # Recalled turns are grouped under one "[2023-05-08]" heading per day:
                # the date is paid once a day instead of on every line (docs/quality.md).
                line = turn_line(t, locale)
                day = f"[{t.created_at:%Y-%m-%d}]"
                candidates[name].append(_Candidate(line, count(line) + 1, t.seq, t, day, count(day) + 1))
                continue
            line = turn_line(t, locale, now=now)
            candidates[name].append(_Candidate(line, count(line) + 1, t.seq, t))
    candidates["recent"] = _recent_candidates(plan.recent, config.tool_limits, shape)

    section_overheads = {
        name: count(section_text(name, layer_title(name, locale), [""])) + sep_cost
        for name in FLEXIBLE_LAYERS
        if name != "recent" or not as_messages
    }
    section_overheads.setdefault("recent", 0)
    demands = {
        name: (section_overheads[name] + sum(c.cost for c in cands)) if cands else 0
        for name, cands in candidates.items()
    }
    caps = {n: v for n, v in budget.allocations.items() if n in FLEXIBLE_LAYERS} or None
    weights = budget.shares or plan.shares
    alloc = allocate(available, demands, caps=caps, weights=weights)
    # Each layer's nominal share (every layer hungry), for the accounting: a layer shows
    # its share even when it needed less and gave the rest away.
    nominal = allocate(
        available,
        {n: (d if n == "constraints" else available) for n, d in demands.items()},
        caps=caps,
        weights=weights,
    )
    shares = {n: max(alloc[n], nominal.get(n, 0)) for n in alloc}

    chosen: dict[LayerName, list[_Candidate]] = {}
    dropped: dict[LayerName, list[int]] = {}
    truncated: dict[LayerName, bool] = {}
    leftover = available - sum(alloc.values())
    fill_order: tuple[LayerName, ...] = ("constraints", "summary", "key_moments", "recall", "recent")
    for name in fill_order:
        cands = candidates[name]
        limit = alloc.get(name, 0) + (leftover if name == "recent" else 0)
        if name == "recent":
            picked, cut = _fill_units(cands, limit - section_overheads[name], count)
        else:
            picked, cut = _fill(name, cands, limit - section_overheads[name], count, as_messages, overhead)
        if not picked:
            picked, cut = [], False
        day_costs = {c.day: c.day_cost for c in picked if c.day is not None}
        used = (section_overheads[name] + sum(c.cost for c in picked) + sum(day_costs.values())) if picked else 0
        if name != "recent":
            leftover += max(0, alloc.get(name, 0) - used)
        chosen[name] = picked
        truncated[name] = cut
        # By seq, not identity: a turn cut to fit is a new candidate but was not dropped.
        picked_seqs = {c.seq for c in picked}
        dropped[name] = [c.seq for c in cands if c.seq not in picked_seqs and c.seq is not None and name != "constraints"]

    shown_hint = hint.strip() if hint and hint.strip() != sent.strip() else None
    return replace(_render(
        state=state, message=message, sent=sent, current_text=current_text, current_cost=current_cost,
        fixed_sections=fixed_sections, fixed_costs=fixed_costs, chosen=chosen, dropped=dropped,
        truncated=truncated, alloc=shares, budget=budget, order=order, locale=locale,
        as_messages=as_messages, counter=counter, count=count, strategy=strategy.name,
        now=now, input_budget=input_budget, section_overheads=section_overheads, step=step,
    ), hint=shown_hint)


# -- agent items (tool calls and results): see assembly/agent.py -----------------


def _drop_oldest_unit(chosen: dict[LayerName, list[_Candidate]], dropped: dict[LayerName, list[int]]) -> None:
    """Drop the oldest recent turn, with the rest of its unit (a call and its results)."""
    oldest = min(chosen["recent"], key=lambda c: c.seq or 0)
    gone = [c for c in chosen["recent"] if c is oldest or (c.group is not None and c.group == oldest.group)]
    chosen["recent"] = [c for c in chosen["recent"] if c not in gone]
    dropped["recent"] = [*(c.seq for c in gone if c.seq is not None), *dropped["recent"]]


@dataclass(frozen=True)
class _Shape:
    """How agent items are costed and shown in this assembly."""

    counter: TokenCounter
    count: Callable[[str], int]
    locale: str
    as_messages: bool

    @property
    def zh(self) -> bool:
        return self.locale.startswith("zh")


def _current_step(
    turns: Sequence[Turn], available: int, pins_reserve: int, shape: _Shape, sent: str, current_text: str
) -> tuple[list[_Candidate], int, str]:
    """The agent step after the current message, its cost, and the current section (text form)."""
    if not turns:
        return [], 0, current_text
    step, cost = _agent_step(turns, available - pins_reserve, shape)
    if cost > available:  # not even the markers fit with the pins' room kept aside
        step, cost = _agent_step(turns, available, shape)
    if not shape.as_messages:
        lines = [f"{role_label('user', shape.locale)}: {sent}", *(c.line for c in step)]
        current_text = section_text("current", layer_title("current", shape.locale), lines)
    return step, cost, current_text


def _pins_reserve(state: SessionState, count: Callable[[str], int], locale: str, sep_cost: int, available: int) -> int:
    """Room an agent step leaves for the pinned constraints: four times what they cost, since
    they may take a quarter of what remains (`allocate`); at most half of ``available``."""
    if not state.constraints:
        return 0
    demand = count(section_text("constraints", layer_title("constraints", locale), [""])) + sep_cost
    demand += sum(count(constraint_line(c)) + 1 for c in state.constraints)
    return min(4 * demand, available // 2)


def _agent_line(item: AgentItem, locale: str) -> str:
    """A recent or step item as a text-format line: agent items as a sentence, never raw JSON."""
    zh = locale.startswith("zh")
    if item.turn.role == "tool":
        return f"{role_label('tool', locale)}: {data_text(item.text)}"
    line = turn_line(item.turn, locale, content=item.text)
    if item.tool_calls:
        line = f"{role_label('assistant', locale)}: {data_text(tool_sentence(item.turn, zh=zh))}"
    return line


def _agent_candidate(item: AgentItem, shape: _Shape) -> _Candidate:
    if shape.as_messages:
        cost = item_cost(item, shape.counter, shape.count)
        return _Candidate(item.text, cost, item.turn.seq, item.turn, item=item, group=item.group)
    line = _agent_line(item, shape.locale)
    return _Candidate(item.text, shape.count(line) + 1, item.turn.seq, item.turn, item=item, group=item.group)


def _agent_step(turns: Sequence[Turn], room: int, shape: _Shape) -> tuple[list[_Candidate], int]:
    """The current agent step as candidates, and what it costs (results cut only to fit ``room``)."""
    items, _ = step_items(turns, room, counter=shape.counter, count=shape.count, zh=shape.zh)
    cands = [_agent_candidate(i, shape) for i in items]
    if not shape.as_messages:
        for c, item in zip(cands, items, strict=True):
            c.line = _agent_line(item, shape.locale)
    return cands, sum(c.cost for c in cands)


def _recent_candidates(turns: Sequence[Turn], limits: ToolLimits, shape: _Shape) -> list[_Candidate]:
    """Recent turns newest first, grouped into units (a call with its results); older
    results elided to their tool's limit."""
    items = list(iter_items(agent_units(turns), limits=limits, count=shape.count, zh=shape.zh))
    return [_agent_candidate(i, shape) for i in reversed(items)]


def _fill_units(cands: Sequence[_Candidate], limit: int, count: Callable[[str], int]) -> tuple[list[_Candidate], bool]:
    """Recent turns newest first, a unit at a time; the window stays contiguous. The newest
    plain turn alone too big keeps its newest part (seed 001); a unit is never cut."""
    picked: list[_Candidate] = []
    spent = 0
    i = 0
    while i < len(cands):
        j = i
        while j < len(cands) and cands[j].group == cands[i].group:
            j += 1
        unit = cands[i:j]
        cost = sum(c.cost for c in unit)
        if spent + cost <= limit:
            picked.extend(unit)
            spent += cost
            i = j
            continue
        only = unit[0]
        if not picked and len(unit) == 1 and only.turn is not None and only.item is not None and not only.item.tool_calls \
                and only.turn.role != "tool":
            extra = only.cost - count(only.line)
            text = cut_to_tokens(only.line, limit - extra, count)
            if text:
                item = AgentItem(turn=only.turn, text=text, group=only.group or 0, elided=True)
                picked.append(_Candidate(text, count(text) + extra, only.seq, only.turn, item=item, group=only.group))
                return picked, True
        break
    return picked, False


def _layer_item(c: _Candidate, text: str) -> LayerItem:
    """A recent or step turn as a layer item (with its tool calls or the call it answers)."""
    turn, item = c.turn, c.item
    return LayerItem(
        text=text, tokens=c.cost, seq=c.seq, role=turn.role if turn else None,
        created_at=turn.created_at if turn else None,
        truncated=item.elided if item else (turn is not None and c.line != turn.content),
        tool_calls=item.tool_calls if item else (), tool_call_id=item.tool_call_id if item else None,
    )


def _fill(
    name: LayerName,
    cands: Sequence[_Candidate],
    limit: int,
    count: Callable[[str], int],
    as_messages: bool,
    overhead: int,
) -> tuple[list[_Candidate], bool]:
    """Pick candidates (already in priority order) within ``limit`` tokens."""
    picked: list[_Candidate] = []
    spent = 0
    days: set[str] = set()
    for cand in cands:
        cost = cand.cost + (cand.day_cost if cand.day is not None and cand.day not in days else 0)
        if spent + cost <= limit:
            picked.append(cand)
            spent += cost
            if cand.day is not None:
                days.add(cand.day)
        elif name == "recent":
            if not picked and cand.turn is not None:
                # The newest turn alone is too big: keep its newest part (design article 001).
                extra = cand.cost - cand.turn.tokens
                text = cut_to_tokens(cand.line, limit - extra, count)
                if text:
                    picked.append(_Candidate(text, count(text) + extra, cand.seq, cand.turn))
                    return picked, True
            break  # keep the recent window contiguous
        elif name == "summary":
            text = cut_to_tokens(cand.line, limit - 1, count)
            if text:
                picked.append(_Candidate(text, count(text) + 1, cand.seq))
                return picked, True
    return picked, False


def _render(
    *,
    state: SessionState,
    message: str,
    sent: str,
    current_text: str,
    current_cost: int,
    fixed_sections: dict[LayerName, str],
    fixed_costs: dict[LayerName, int],
    chosen: dict[LayerName, list[_Candidate]],
    dropped: dict[LayerName, list[int]],
    truncated: dict[LayerName, bool],
    alloc: dict[LayerName, int],
    budget: Budget,
    order: Sequence[LayerName],
    locale: str,
    as_messages: bool,
    counter: TokenCounter,
    count: Callable[[str], int],
    strategy: str,
    now: datetime,
    input_budget: int,
    section_overheads: dict[LayerName, int],
    step: Sequence[_Candidate] = (),
) -> Context:
    layers: list[LayerContent] = []
    accounts: dict[LayerName, LayerAccount] = {}
    section_texts: list[str] = []
    overhead = message_overhead(counter, "system")
    while True:
        layers.clear()
        accounts.clear()
        section_texts.clear()
        total = 0
        for name in order:
            title = layer_title(name, locale)
            if name in fixed_sections:
                text = fixed_sections[name]
                used = count(text) + count(SECTION_SEPARATOR)
                layers.append(LayerContent(name=name, title=title, items=(LayerItem(text=text, tokens=used),), rendered=text))
                accounts[name] = LayerAccount(name=name, allocated=budget.allocations.get(name, fixed_costs[name]), used=used, items=1)
                section_texts.append(text)
                continue
            if name == "current":
                step_cost = sum(c.cost for c in step)
                items: tuple[LayerItem, ...] = (
                    LayerItem(text=sent, tokens=current_cost - step_cost, role="user"),
                    *(_layer_item(c, c.line) for c in step),
                )
                layers.append(LayerContent(name=name, title=title, items=items, rendered="" if as_messages else current_text))
                accounts[name] = LayerAccount(name=name, allocated=current_cost, used=current_cost, items=len(items))
                if not as_messages:
                    section_texts.append(current_text)
                continue
            if name not in chosen:
                continue
            picked = chosen[name]
            if name in ("key_moments", "recall", "recent", "constraints"):
                # Shown oldest first (recall: day by day, so each day heading appears once).
                picked = sorted(picked, key=lambda c: (c.day or "", c.seq or 0))
            if name == "recent":
                # Each answer right after the message it answers, even if turns were stored interleaved.
                position = {t.seq: i for i, t in enumerate(paired_turns([c.turn for c in picked if c.turn]))}
                picked = sorted(picked, key=lambda c: position.get(c.seq or 0, -1))
            allocated = alloc.get(name, 0)
            if not picked:
                if allocated or dropped[name]:
                    accounts[name] = LayerAccount(name=name, allocated=allocated, used=0, dropped_seqs=tuple(dropped[name]))
                continue
            if name == "recent" and as_messages:
                items = tuple(_layer_item(c, c.line) for c in picked)
                used = sum(c.cost for c in picked)
                text = ""
            else:
                if name == "recent":
                    lines = [_agent_line(c.item, locale) if c.item else c.line for c in picked]
                else:
                    lines = [c.line for c in picked]
                    if any(c.day for c in picked):
                        lines = [
                            f"{c.day}\n{line}" if c.day and (i == 0 or picked[i - 1].day != c.day) else line
                            for i, (c, line) in enumerate(zip(picked, lines, strict=True))
                        ]
                text = section_text(name, title, lines)
                section_texts.append(text)
                used = count(text) + count(SECTION_SEPARATOR)
                items = tuple(
                    LayerItem(text=line, tokens=c.cost, seq=c.seq, role=c.turn.role if c.turn else None,
                              created_at=c.turn.created_at if c.turn else None)
                    for line, c in zip(lines, picked, strict=True)
                )
            layers.append(LayerContent(name=name, title=title, items=items, rendered=text))
            accounts[name] = LayerAccount(
                name=name, allocated=max(allocated, used), used=used, items=len(items),
                dropped_seqs=tuple(dropped[name]), truncated=truncated[name],
            )
        if as_messages:
            system_content = SECTION_SEPARATOR.join(section_texts)
            total = (count(system_content) + overhead if system_content else 0)
            total += sum(c.cost for c in chosen.get("recent", []))
            total += current_cost
        else:
            total = count(SECTION_SEPARATOR.join(section_texts))
        if total <= input_budget or not chosen.get("recent"):
            break
        # Boundary effects made the exact total exceed the budget: drop the oldest unit and redo.
        _drop_oldest_unit(chosen, dropped)

    if total > input_budget:
        raise MessageTooLarge(total, input_budget)
    return Context(
        layers=tuple(layers),
        accounts=accounts,
        message=sent,
        original_message=message,
        format="messages" if as_messages else "text",
        locale=locale,
        strategy=strategy,
        input_budget=input_budget,
        reply_reserve=budget.reserve,
        total_tokens=total,
        exact=counter.exact,
        counter=counter.name,
        order=tuple(order),
    )
