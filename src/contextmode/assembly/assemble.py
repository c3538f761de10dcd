"""Assembly: fit a memory plan into the budget and render it, with exact accounting.

Cost grows with the window, not the history: recent turns are walked back
from the tail using their stored token counts; only the rendered sections
(summary, constraints, moments) are counted, through a small cache.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from functools import lru_cache

from ..errors import ConfigError, MessageTooLarge
from ..memory.budget import FLEXIBLE_LAYERS, Budget, LayerName, allocate
from ..memory.strategies import Strategy, get_strategy
from ..processors.intents import is_chinese
from ..tokens.base import TokenCounter
from ..types import SessionState, Turn, utc_now
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

    def resolved_order(self) -> tuple[LayerName, ...]:
        order = order_preset(self.order) if isinstance(self.order, str) else tuple(self.order)
        missing = set(ORDER_PRESETS["default"]) - set(order)
        if missing:
            raise ConfigError(f"layer order misses {sorted(missing)}")
        return order


ESTIMATE_MARGIN = 0.05
"""Share of the input budget left unused when token counts are estimates, not exact."""

_COUNT_CACHES: dict[int, tuple[TokenCounter, Callable[[str], int]]] = {}


def _cached_count(counter: TokenCounter) -> Callable[[str], int]:
    """``counter.count`` behind an LRU cache (sections repeat from turn to turn)."""
    entry = _COUNT_CACHES.get(id(counter))
    if entry is None or entry[0] is not counter:
        entry = (counter, lru_cache(maxsize=8192)(counter.count))
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
) -> Context:
    """Build exactly what the model receives for ``message``, inside ``budget``.

    ``standalone`` is the rewritten question when the message needed context;
    it replaces the message as sent (decoupled mode). ``hint`` is a verified rewrite shown
    as a labelled hint after the system prompt while the message is sent verbatim
    (contextual mode). Raises `MessageTooLarge` when the message
    alone does not fit the input budget.
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
    # Chat formats such as DeepSeek's wrap each role differently; count each role's own overhead.
    role_overheads = getattr(counter, "role_overheads", None) or {}
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
        current_cost = count(sent) + role_overheads.get("user", overhead) + counter.reply_overhead
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
    system_message_overhead = role_overheads.get("system", overhead) if as_messages else 0
    available = input_budget - current_cost - sum(fixed_costs.values()) - system_message_overhead
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
    label_costs = {role: count(f"{role_label(role, locale)}: ") for role in ("user", "assistant", "system")}
    for t in reversed(plan.recent):  # newest first
        cost = t.tokens + role_overheads.get(t.role, overhead) if as_messages else t.tokens + label_costs[t.role] + 1
        candidates["recent"].append(_Candidate(t.content, cost, t.seq, t))

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
        now=now, input_budget=input_budget, section_overheads=section_overheads,
    ), hint=shown_hint)


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
) -> Context:
    layers: list[LayerContent] = []
    accounts: dict[LayerName, LayerAccount] = {}
    section_texts: list[str] = []
    overhead = (getattr(counter, "role_overheads", None) or {}).get("system", counter.message_overhead)
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
                items: tuple[LayerItem, ...] = (LayerItem(text=sent, tokens=current_cost, role="user"),)
                layers.append(LayerContent(name=name, title=title, items=items, rendered="" if as_messages else current_text))
                accounts[name] = LayerAccount(name=name, allocated=current_cost, used=current_cost, items=1)
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
                items = tuple(
                    LayerItem(text=c.line, tokens=c.cost, seq=c.seq, role=c.turn.role if c.turn else None,
                              created_at=c.turn.created_at if c.turn else None, truncated=c.turn is not None and c.line != c.turn.content)
                    for c in picked
                )
                used = sum(c.cost for c in picked)
                text = ""
            else:
                if name == "recent":
                    lines = [turn_line(c.turn, locale, content=c.line) if c.turn else c.line for c in picked]
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
        # Boundary effects made the exact total exceed the budget: drop the oldest turn and redo.
        oldest = min(chosen["recent"], key=lambda c: c.seq or 0)
        chosen["recent"] = [c for c in chosen["recent"] if c is not oldest]
        if oldest.seq is not None:
            dropped["recent"] = [oldest.seq, *dropped["recent"]]

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
