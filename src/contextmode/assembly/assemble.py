"""Assembly: fit a memory plan into the budget and render it, with exact accounting.

Cost grows with the window, not the history: recent turns are walked back
from the tail using their stored token counts; only the rendered sections
(summary, constraints, moments) are counted, through a small cache.
"""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import date, datetime
from functools import lru_cache

from ..errors import ConfigError, MessageTooLarge
from ..memory.budget import FLEXIBLE_LAYERS, Budget, LayerName, allocate
from ..memory.strategies import MemoryPlan, Strategy, get_strategy
from ..text import is_chinese
from ..text.neutralise import neutralise
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
    after_window,
    constraint_line,
    data_text,
    layer_title,
    message_line,
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
    "CurrentTurn",
    "assemble",
    "cut_to_tokens",
    "order_preset",
    "paired_turns",
]

ORDER_PRESETS: dict[str, tuple[LayerName, ...]] = {
    # The shipped order. Chronological: background (summary, key moments, recall) first, then the newest turns,
    # the message and the reply instruction (the emotional-companion article's order). Every
    # non-turn layer goes in the system message, so the messages alternate user/assistant as
    # strict chat templates (Gemma, Mistral) demand.
    "default": (
        "system", "hint", "constraints", "summary", "key_moments", "recall", "recent", "current", "format",
    ),
    # Stable first, what changes every turn last (docs/caching.md): instructions, reply format,
    # pins, the summary and the window make a prefix the next turn's request repeats byte for
    # byte (what prompt caches reuse); the key moments, the recalled turns and the rewrite hint
    # follow the window, as one message before the current one (two user messages in a row: a
    # strict-alternation template that refuses them gets them merged by the model adapter,
    # `models.openai.alternating`). The prompt-cache preset, with the ``steady`` strategy.
    "cache_first": (
        "system", "format", "constraints", "summary", "recent", "key_moments", "recall", "hint", "current",
    ),
    # The question right after the pinned constraints, then the turns and the summary
    # (the context-manager article's order).
    "question_first": (
        "system", "hint", "constraints", "current", "recent", "summary", "key_moments", "recall", "format",
    ),
}
"""Layer order presets by name (``CONTEXTMODE_ORDER``)."""

DEPRECATED_ORDER_NAMES: dict[str, str] = {
    "seed001": "default", "seed003": "question_first",
}
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
    raw_message: bool = False
    """Send the current message with its chat-template control strings whole; by default they
    are broken like those of stored text (`contextmode.text.neutralise`)."""

    def resolved_order(self) -> tuple[LayerName, ...]:
        order = order_preset(self.order) if isinstance(self.order, str) else tuple(self.order)
        if "hint" not in order and "system" in order:  # an order written before the hint had a place
            at = order.index("system") + 1
            order = (*order[:at], "hint", *order[at:])
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

    Keeps the newest part of a turn that cannot fit whole; ``""``
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
    optional: bool = False
    """Constraints: a pinned fact, which comes first only within the layer's share."""
    backfill: bool = False
    """Recent turns: an older loaded turn the window grows back over only with budget no
    layer used (`MemoryPlan.backfill`); not part of the recent layer's demand."""
    spare: bool = False
    """Recall: a turn added with budget left after every layer was filled; the first to go
    when the exact total is over."""


def paired_turns(turns: Sequence[Turn]) -> list[Turn]:
    """``turns`` oldest first, each assistant answer moved right after the user message it
    answers (``reply_to`` in its metadata), so ``user, user, answer, answer`` becomes
    ``user, answer, user, answer``.

    Sessions written before turns of one session were serialised may hold such
    interleaved runs; an answer whose question is not among ``turns`` keeps its place.
    The ``tool`` results stored after an assistant turn move with it: a call and its
    results stay one block (an agent step answers one question with several assistant
    turns, and moving them alone would put a call's results after the next answer).
    """
    ordered = sorted(turns, key=lambda t: t.seq)
    questions = {t.seq for t in ordered if t.role == "user"}
    blocks: list[list[Turn]] = []
    for t in ordered:
        if t.role == "tool" and blocks:
            blocks[-1].append(t)  # a result rides with the turn (its call) before it
        else:
            blocks.append([t])
    answers: dict[int, list[list[Turn]]] = {}
    moved: set[int] = set()
    for block in blocks:
        head = block[0]
        reply_to = head.metadata.get("reply_to") if head.role == "assistant" else None
        if isinstance(reply_to, int) and reply_to in questions and reply_to < head.seq:
            answers.setdefault(reply_to, []).append(block)
            moved.add(head.seq)
    result: list[Turn] = []
    for block in blocks:
        if block[0].seq in moved:
            continue
        result.extend(block)
        for answer in answers.get(block[0].seq, ()):
            result.extend(answer)
    return result


@dataclass(frozen=True, kw_only=True)
class CurrentTurn:
    """What the current layer holds beside the user's message (each part optional)."""

    standalone: str | None = None
    """The rewritten question when the message needed context: it replaces the message as
    sent (decoupled mode)."""
    hint: str | None = None
    """A verified rewrite shown as a labelled hint after the system prompt while the message
    is sent verbatim (contextual mode)."""
    agent_step: Sequence[Turn] = ()
    """The tool calls and results that followed the message (an agent loop's current step):
    they come after it, always present, their results cut only when the whole step does not fit."""
    quotes: int | None = None
    """The stored turn the message as sent quotes whole (a follow-up template around the last
    answer): it is not sent a second time in any layer."""


def assemble(
    state: SessionState,
    message: str,
    *,
    counter: TokenCounter,
    strategy: str | Strategy = "default",
    budget: Budget | None = None,
    config: AssemblyConfig | None = None,
    now: datetime | None = None,
    current: CurrentTurn | None = None,
) -> Context:
    """Build exactly what the model receives for ``message``, inside ``budget``.

    ``current`` adds what the current layer holds beside the message: the standalone
    rewrite sent in its place, a rewrite hint, an agent step (`CurrentTurn`). Raises
    `MessageTooLarge` when the message alone does not fit the input budget.

    The steps: settle the frame (format, locale, counting, input budget), the layers that
    are always whole, each flexible layer's candidates, the allocation, the choice within
    it, and the rendering of each layer.
    """
    strategy = get_strategy(strategy)
    budget = budget or Budget()
    config = config or AssemblyConfig()
    current = current or CurrentTurn()
    now = now or utc_now()
    frame = _frame(state, message, counter, budget, config)
    plan = strategy.plan(state, message, now=now)
    sent = current.standalone or message
    if not config.raw_message:
        sent = neutralise(sent)
    fixed = _fixed_layers(state, frame, config, sent, current)
    if current.quotes is not None:
        plan = _without(plan, current.quotes)
    candidates = _candidates(state, plan, frame, now, config.tool_limits)
    whole = _whole_when_it_fits(candidates, fixed.available)
    allocation = _allocate(candidates, frame, fixed.available, budget.shares or plan.shares)
    steady = _steady(plan, fixed, budget)
    # A session sent whole keeps its prefix too (the summary need not run, the pins are in it).
    kept_steady = steady is not None and (whole or _steady_pays(steady, frame))
    if steady is not None and not whole and kept_steady:
        selection = _select_steady(candidates, allocation, fixed.available, frame, steady)
    else:
        if steady is not None and whole:  # a session sent whole: its pins are in the window, said verbatim
            candidates["constraints"] = []
        selection = _select(candidates, allocation, fixed.available, frame)
    hint = current.hint
    return _render(_RenderContext(
        frame=frame, message=message, sent=sent, strategy=strategy.name, fixed=fixed,
        selection=selection, allocated=allocation.shown, steady=kept_steady,
        hint=hint.strip() if hint and hint.strip() != sent.strip() else None,
    ))


@dataclass(frozen=True, kw_only=True)
class _Frame:
    """What one assembly settles before it looks at memory: format, locale, counting, budget."""

    counter: TokenCounter
    count: Callable[[str], int]
    locale: str
    as_messages: bool
    order: tuple[LayerName, ...]
    budget: Budget
    input_budget: int
    sep_cost: int
    tail: frozenset[LayerName] = frozenset()
    """Message form: the layers sent as one message after the recent turns (`after_window`)."""

    @property
    def shape(self) -> _Shape:
        return _Shape(counter=self.counter, count=self.count, locale=self.locale, as_messages=self.as_messages)


def _frame(state: SessionState, message: str, counter: TokenCounter, budget: Budget, config: AssemblyConfig) -> _Frame:
    order = config.resolved_order()
    count = _cached_count(counter)
    # An estimate can be a few per cent low (docs/tokens.md: Chinese sums −2.6…−4.6 %):
    # keep a margin so the real count stays inside the window too.
    input_budget = budget.input_tokens if counter.exact else int(budget.input_tokens * (1 - ESTIMATE_MARGIN))
    return _Frame(
        counter=counter, count=count, locale=_locale(config, message, state), as_messages=config.format == "messages",
        order=order, budget=budget, input_budget=input_budget, sep_cost=count(SECTION_SEPARATOR),
        tail=after_window(order) if config.format == "messages" else frozenset(),
    )


@dataclass(frozen=True, kw_only=True)
class _Fixed:
    """The layers that are always whole (the current message and its agent step, the system
    prompt, the reply format) and what they leave for the flexible layers."""

    current_text: str
    """The current section (text form)."""
    current_cost: int
    """The current message with its agent step, overhead included."""
    step: Sequence[_Candidate]
    sections: dict[LayerName, str]
    costs: dict[LayerName, int]
    available: int
    """Tokens left for the flexible layers."""


def _current_section(frame: _Frame, sent: str) -> tuple[str, int]:
    """The current message as sent (a section in text form) and what it costs."""
    counter = frame.counter
    if frame.as_messages:
        return sent, frame.count(sent) + message_overhead(counter, "user") + counter.reply_overhead
    locale = frame.locale
    text = section_text("current", layer_title("current", locale), [message_line(sent, locale)])
    return text, frame.count(text) + frame.sep_cost


def _instruction_sections(frame: _Frame, config: AssemblyConfig, sent: str, hint: str | None) -> dict[LayerName, str]:
    """The system prompt (with the rewrite hint) and the reply format, when not empty."""
    locale = frame.locale
    lang = "zh" if locale.startswith("zh") else "en"
    system_text = DEFAULT_SYSTEM_PROMPT[lang] if config.system_prompt is None else config.system_prompt
    sections: dict[LayerName, str] = {}
    if system_text:
        sections["system"] = section_text("system", "", [system_text])
    if hint and hint.strip() != sent.strip():
        sections["hint"] = section_text("hint", "", [rewrite_hint(hint, locale)])
    if config.reply_format:
        sections["format"] = section_text("format", layer_title("format", locale), [config.reply_format])
    return sections


def _fixed_layers(state: SessionState, frame: _Frame, config: AssemblyConfig, sent: str, current: CurrentTurn) -> _Fixed:
    """The whole layers; `MessageTooLarge` when they alone exceed the input budget."""
    current_text, current_cost = _current_section(frame, sent)
    if current_cost > frame.input_budget:
        raise MessageTooLarge(current_cost, frame.input_budget)
    sections = _instruction_sections(frame, config, sent, current.hint)
    costs = {name: frame.count(text) + frame.sep_cost for name, text in sections.items()}
    system_message_overhead = message_overhead(frame.counter, "system") if frame.as_messages else 0
    # The message after the recent turns (`_Frame.tail`): its overhead is whole-layer cost when
    # it holds the hint, else it comes out of what the flexible layers get.
    tail_overhead = message_overhead(frame.counter, "user") if frame.tail else 0
    if "hint" in sections and "hint" in frame.tail:
        system_message_overhead, tail_overhead = system_message_overhead + tail_overhead, 0
    available = frame.input_budget - current_cost - sum(costs.values()) - system_message_overhead
    reserve = _pins_reserve(state, frame.count, frame.locale, frame.sep_cost, available)
    step, step_cost, current_text = _current_step(current.agent_step, available - tail_overhead, reserve, frame.shape,
                                                  sent, current_text)
    current_cost += step_cost
    available -= step_cost
    if available < 0:
        raise MessageTooLarge(current_cost + sum(costs.values()), frame.input_budget)
    available = max(0, available - tail_overhead)
    return _Fixed(current_text=current_text, current_cost=current_cost, step=step, sections=sections, costs=costs,
                  available=available)


def _candidates(
    state: SessionState, plan: MemoryPlan, frame: _Frame, now: datetime, limits: ToolLimits
) -> dict[LayerName, list[_Candidate]]:
    """Each flexible layer's candidates and their costs, in priority order."""
    count, locale = frame.count, frame.locale
    candidates: dict[LayerName, list[_Candidate]] = {name: [] for name in FLEXIBLE_LAYERS}
    # Newest first: they win when space is short; pinned facts after the preferences,
    # constraints and identity (they come first only within the layer's share, see `allocate`).
    for c in sorted(reversed(state.constraints), key=lambda c: c.kind == "fact"):
        line = constraint_line(c)
        candidates["constraints"].append(_Candidate(line, count(line) + 1, c.source_seq, optional=c.kind == "fact"))
    if plan.summary is not None and plan.summary.text.strip():
        text = data_text(plan.summary.text.strip())
        candidates["summary"].append(_Candidate(text, count(text) + 1, None))
    for t in plan.key_moments:
        line = turn_line(t, locale, now=now)
        candidates["key_moments"].append(_Candidate(line, count(line) + 1, t.seq, t))
    for t in plan.recall:
        candidates["recall"].append(_recall_candidate(t, frame))
    older = list(reversed(plan.backfill))
    candidates["recent"] = _recent_candidates([*older, *plan.recent], limits, frame.shape)
    first_recent = plan.recent[0].seq if plan.recent else None
    for cand in candidates["recent"]:
        cand.backfill = first_recent is None or (cand.seq is not None and cand.seq < first_recent)
    return candidates


def _whole_when_it_fits(candidates: dict[LayerName, list[_Candidate]], available: int) -> bool:
    """When every turn of the session is loaded and they all fit with the pins, the turns go
    whole: the summary and key moments (which only restate them) and recall (which would show
    them again) step aside, so a larger budget never shows fewer turns than a smaller one."""
    recent = candidates["recent"]
    if not recent or min(c.seq or 0 for c in recent) != 1:
        return False
    pins = sum(c.cost for c in candidates["constraints"])
    if sum(c.cost for c in recent) + pins > available:
        return False
    for name in ("summary", "key_moments", "recall"):
        candidates[name] = []
    for c in recent:
        c.backfill = False
    return True


@lru_cache(maxsize=4096)
def _day_heading(day: date) -> str:
    """A recall day's heading, ``[2023-05-08]`` (formatted once per day: ``strftime`` costs
    more than the cache's look-up, and a context's recalled turns share a few days)."""
    return f"[{day:%Y-%m-%d}]"


def _recall_candidate(t: Turn, frame: _Frame, *, spare: bool = False) -> _Candidate:
    """A turn as a recall line, grouped under one "[2023-05-08]" heading per day: the date
    is paid once a day instead of on every line (docs/quality.md)."""
    line = turn_line(t, frame.locale)
    day = _day_heading(t.created_at.date())
    return _Candidate(line, frame.count(line) + 1, t.seq, t, day, frame.count(day) + 1, spare=spare)


def _without(plan: MemoryPlan, seq: int) -> MemoryPlan:
    """``plan`` without the turn ``seq`` in any layer (the message as sent quotes it whole)."""
    def keep(turns: Sequence[Turn]) -> tuple[Turn, ...]:
        return tuple(t for t in turns if t.seq != seq)

    return replace(plan, recent=keep(plan.recent), key_moments=keep(plan.key_moments), recall=keep(plan.recall),
                   backfill=keep(plan.backfill))


def _demand(cands: Sequence[_Candidate], overhead: int) -> int:
    """What a layer could use: its section, every candidate as filled (each day heading of
    recall once), the recent window without the older turns it grows back over."""
    wanted = [c for c in cands if not c.backfill]
    if not wanted:
        return 0
    days = {c.day: c.day_cost for c in wanted if c.day is not None}
    return overhead + sum(c.cost for c in wanted) + sum(days.values())


@dataclass(frozen=True, kw_only=True)
class _Allocation:
    """Each flexible layer's tokens, its share as shown in the accounting, its section's overhead."""

    tokens: dict[LayerName, int]
    shown: dict[LayerName, int]
    """Each layer's nominal share (every layer hungry) or more: a layer shows its share even
    when it needed less and gave the rest away."""
    section_overheads: dict[LayerName, int]


def _allocate(
    candidates: dict[LayerName, list[_Candidate]], frame: _Frame, available: int, weights: Mapping[LayerName, float]
) -> _Allocation:
    """Split ``available`` among the flexible layers by what their candidates cost."""
    count, locale = frame.count, frame.locale
    section_overheads = {
        name: count(section_text(name, layer_title(name, locale), [""])) + frame.sep_cost
        for name in FLEXIBLE_LAYERS
        if name != "recent" or not frame.as_messages
    }
    section_overheads.setdefault("recent", 0)
    demands = {name: _demand(cands, section_overheads[name]) for name, cands in candidates.items()}
    caps = {n: v for n, v in frame.budget.allocations.items() if n in FLEXIBLE_LAYERS} or None
    optional = sum(c.cost for c in candidates["constraints"] if c.optional)
    tokens = allocate(available, demands, caps=caps, weights=weights, optional_pins=optional)
    nominal = allocate(
        available,
        {n: (d if n == "constraints" else available) for n, d in demands.items()},
        caps=caps,
        weights=weights,
        optional_pins=optional,
    )
    shown = {n: max(tokens[n], nominal.get(n, 0)) for n in tokens}
    return _Allocation(tokens=tokens, shown=shown, section_overheads=section_overheads)


@dataclass(frozen=True, kw_only=True)
class _Selection:
    """The candidates chosen per flexible layer, those left out (by seq), and which layers were cut."""

    chosen: dict[LayerName, list[_Candidate]]
    dropped: dict[LayerName, list[int]]
    truncated: dict[LayerName, bool]
    queue: list[_Candidate] = field(default_factory=list)
    """Turns still left out, best first, that the exact rendering may yet find room for."""


_FILL_ORDER: tuple[LayerName, ...] = ("constraints", "summary", "key_moments", "recall", "recent")
"""Flexible layers in the order they are filled; the recent turns take what the others left."""


def _select(
    candidates: dict[LayerName, list[_Candidate]], allocation: _Allocation, available: int, frame: _Frame
) -> _Selection:
    """Fill each flexible layer within its allocation, then spend what is left on turns still
    left out (`_spend_leftover`). A turn is shown once: recall skips what the key moments hold;
    the recent window, growing back over older turns with the budget no layer used, takes over a
    turn recall or the key moments show (and their tokens with it)."""
    alloc, section_overheads, count = allocation.tokens, allocation.section_overheads, frame.count
    chosen: dict[LayerName, list[_Candidate]] = {}
    truncated: dict[LayerName, bool] = {}
    leftover = available - sum(alloc.values())
    for name in _FILL_ORDER:
        cands = candidates[name]
        limit = alloc.get(name, 0) + (leftover if name == "recent" else 0) - section_overheads[name]
        if name == "recent":
            picked, cut = _fill_recent(cands, limit, count, chosen)
        else:
            if name == "recall":
                held = {c.seq for c in chosen.get("key_moments", [])}
                cands = [c for c in cands if c.seq not in held]
            picked, cut = _fill(name, cands, limit, count, frame.as_messages, frame.counter.message_overhead)
        if not picked:
            picked, cut = [], False
        if name != "recent":
            leftover += max(0, alloc.get(name, 0) - _used(picked, section_overheads[name]))
        chosen[name] = picked
        truncated[name] = cut
    queue = _spend_leftover(candidates, chosen, section_overheads, available, frame)
    return _Selection(chosen=chosen, dropped=_dropped(candidates, chosen), truncated=truncated, queue=queue)


_VOLATILE_LAYERS: tuple[LayerName, ...] = ("key_moments", "recall")


@dataclass(frozen=True, kw_only=True)
class _Steady:
    """What keeps a request's prefix steady (`MemoryPlan.steady_from`)."""

    start: int
    """The first turn the window may hold (`MemoryPlan.steady_from`)."""
    base: int
    """The flexible budget before the current message: the shares are taken from it, so a
    longer or shorter message moves none of the stable layers (the volatile ones absorb it)."""
    volatile_max: int | None
    """Tokens at most for the layers after the window (key moments, recall); the rest of their
    share goes to the window."""
    weights: Mapping[LayerName, float]


STEADY_KEEP = 0.85
"""Share of its budget a steady window keeps when its turns no longer fit: it drops a block of
its oldest turns (15 % of its budget) at once, not a turn per turn. A larger block keeps the
prefix longer but leaves more budget to the layers after the window (docs/caching.md)."""


def _steady(plan: MemoryPlan, fixed: _Fixed, budget: Budget) -> _Steady | None:
    """The steady window's terms when the plan asks for one (`MemoryPlan.steady_from`)."""
    if plan.steady_from is None:
        return None
    return _Steady(start=plan.steady_from, base=fixed.available + fixed.current_cost + fixed.costs.get("hint", 0),
                   volatile_max=plan.volatile_max_tokens, weights=budget.shares or plan.shares)


STEADY_MIN_TOKENS = 3000
"""Flexible tokens below which a window is not kept steady: a smaller prefix saves little, and
recall needs the room (LoCoMo dev evidence recall at 2,000 tokens: 0.861 recall first, 0.832
with a steady window; docs/caching.md)."""


def _steady_pays(steady: _Steady, frame: _Frame) -> bool:
    """True when the budget is large enough for a steady window (`STEADY_MIN_TOKENS`)."""
    return steady.base >= STEADY_MIN_TOKENS


def _steady_shares(steady: _Steady, frame: _Frame) -> dict[LayerName, int]:
    """Each flexible layer's share of ``steady.base`` when every layer is hungry, the window's
    grown by what the cap on the volatile layers leaves."""
    caps = {n: v for n, v in frame.budget.allocations.items() if n in FLEXIBLE_LAYERS} or None
    shares = allocate(steady.base, dict.fromkeys(FLEXIBLE_LAYERS, steady.base), caps=caps, weights=steady.weights)
    if steady.volatile_max is not None:
        volatile = sum(shares.get(n, 0) for n in _VOLATILE_LAYERS)
        over = max(0, volatile - steady.volatile_max)
        shares["recent"] = shares.get("recent", 0) + over
    return shares


def _select_steady(
    candidates: dict[LayerName, list[_Candidate]], allocation: _Allocation, available: int, frame: _Frame,
    steady: _Steady,
) -> _Selection:
    """`_select` for a request whose prefix stays the same from turn to turn (`MemoryPlan.steady`).

    The summary gets its share of a budget that does not depend on the message or on what recall
    finds (`_steady_shares`); the window the rest of the stable part: every turn the summary does
    not cover while they fit, else the newest `STEADY_KEEP` of it (`_steady_window`); the pins
    shown are those said before the window (the window holds the others verbatim). The key
    moments and recall take the rest, then the budget still free is spent as in `_select`
    (`_spend_leftover`). When the message leaves too little for that, `_select`."""
    overheads, count = allocation.section_overheads, frame.count
    chosen: dict[LayerName, list[_Candidate]] = {}
    truncated: dict[LayerName, bool] = {}
    if not _steady_stable(candidates, overheads, frame, steady, chosen, truncated):
        return _select(candidates, allocation, available, frame)
    picked = chosen["recent"]
    left = available - sum(_used(chosen[name], overheads[name]) for name in chosen)
    if left < 0:  # a long message: this turn cannot keep the prefix
        return _select(candidates, allocation, available, frame)
    shown = {c.seq for c in picked}
    for name in _VOLATILE_LAYERS:
        cands = [c for c in candidates[name] if c.seq not in shown]
        chosen[name], truncated[name] = _fill(name, cands, left - overheads[name], count, frame.as_messages,
                                              frame.counter.message_overhead)
        left -= _used(chosen[name], overheads[name])
        shown.update(c.seq for c in chosen[name])
    queue = _spend_leftover(candidates, chosen, overheads, available, frame)
    return _Selection(chosen=chosen, dropped=_dropped(candidates, chosen), truncated=truncated, queue=queue)


def _steady_stable(
    candidates: dict[LayerName, list[_Candidate]], overheads: Mapping[LayerName, int], frame: _Frame,
    steady: _Steady, chosen: dict[LayerName, list[_Candidate]], truncated: dict[LayerName, bool],
) -> bool:
    """Fill the stable layers of a steady request into ``chosen``: the summary, the window, the
    pins said before it. False when not even the window's newest turn fits (no prefix to keep)."""
    count = frame.count
    shares = _steady_shares(steady, frame)
    chosen["summary"], truncated["summary"] = _fill("summary", candidates["summary"], shares.get("summary", 0)
                                                    - overheads["summary"], count, frame.as_messages,
                                                    frame.counter.message_overhead)
    pins = candidates["constraints"]
    pins_room = min(shares.get("constraints", 0), _demand(pins, overheads["constraints"]))
    room = sum(shares.get(n, 0) for n in ("recent", "summary", "constraints")) - pins_room \
        - _used(chosen["summary"], overheads["summary"]) - overheads["recent"]
    window = [c for c in candidates["recent"] if c.seq is not None and c.seq >= steady.start]
    for c in window:  # the window's own turns: those it drops are listed (and summarised)
        c.backfill = False
    picked, truncated["recent"] = _steady_window(window, room, count)
    if window and not picked:
        return False
    chosen["recent"] = picked
    start = min((c.seq or 0 for c in picked), default=None)
    before = [c for c in pins if start is None or c.seq is None or c.seq < start]
    chosen["constraints"], truncated["constraints"] = _fill(
        "constraints", before, shares.get("constraints", 0) - overheads["constraints"], count, frame.as_messages,
        frame.counter.message_overhead)
    return True


def _steady_window(window: Sequence[_Candidate], room: int, count: Callable[[str], int]) -> tuple[list[_Candidate], bool]:
    """The steady window (newest first): every turn of ``window`` when they fit ``room``, else
    the newest that fit `STEADY_KEEP` of it (units whole, opening with a question): the turns it
    drops are then summarised, and the window grows again from its new start."""
    if sum(c.cost for c in window) <= room:
        return list(window), False
    picked, cut = _fill_recent(window, int(room * STEADY_KEEP), count, {})
    return _block_start(picked, window, STEADY_BLOCK), cut


STEADY_BLOCK = 8
"""A steady window that drops turns starts at the first user turn of a run of this many sequence
numbers (1–8, 9–16…): while the summary has not folded the dropped turns in yet (its job lags
or fails), the start still moves a block at a time, not a turn per turn."""


def _block_start(picked: list[_Candidate], window: Sequence[_Candidate], block: int) -> list[_Candidate]:
    """``picked`` (newest first) without its oldest turns before the newest block start it
    reaches: the first user turn of each run of ``block`` sequence numbers among the window's
    candidates. Unchanged when it reaches none."""
    starts: set[int] = set()
    seen: set[int] = set()
    for c in reversed(window):  # oldest first
        if c.turn is not None and c.turn.role == "user" and c.seq is not None:
            index = (c.seq - 1) // block
            if index not in seen:
                seen.add(index)
                starts.add(c.seq)
    for keep in range(len(picked), 0, -1):
        if picked[keep - 1].seq in starts:  # a user turn: a unit of its own
            return picked[:keep]
    return picked


def _used(picked: Sequence[_Candidate], overhead: int) -> int:
    """What a layer's chosen items cost as filled: section, lines, one heading per day."""
    if not picked:
        return 0
    days = {c.day: c.day_cost for c in picked if c.day is not None}
    return overhead + sum(c.cost for c in picked) + sum(days.values())


def _dropped(candidates: dict[LayerName, list[_Candidate]], chosen: dict[LayerName, list[_Candidate]]) -> dict[LayerName, list[int]]:
    """Per layer, the candidates shown nowhere (by seq, not identity: a turn cut to fit is a
    new candidate but was not dropped; a turn another layer shows was not dropped either).
    The recent window's older turns it could not grow back over are not listed."""
    shown = {c.seq for picked in chosen.values() for c in picked if c.seq is not None}
    return {
        name: [c.seq for c in cands if c.seq is not None and c.seq not in shown and not c.backfill]
        if name != "constraints" else []
        for name, cands in candidates.items()
    }


def _spend_leftover(
    candidates: dict[LayerName, list[_Candidate]], chosen: dict[LayerName, list[_Candidate]],
    overheads: Mapping[LayerName, int], available: int, frame: _Frame,
) -> list[_Candidate]:
    """Budget still free once every layer is filled goes to turns still left out: recall's
    next-ranked first, then the newest of the older loaded turns, as recall lines (evidence
    found is never dropped while budget is free; no budget idles while turns are left out).
    Returns those that did not fit, best first, for the exact top-up after rendering (`_top_up`)."""
    queue: list[_Candidate] = []
    free = available - sum(_used(picked, overheads[name]) for name, picked in chosen.items())
    shown = {c.seq for picked in chosen.values() for c in picked if c.seq is not None}
    wanted = [c for c in candidates["recall"] if c.seq not in shown]
    wanted += [_recall_candidate(c.turn, frame, spare=True) for c in candidates["recent"]
               if c.turn is not None and c.seq not in shown and c.turn.role != "tool" and not c.turn.tool_calls]
    recall = chosen.setdefault("recall", [])
    days = {c.day for c in recall}
    for cand in wanted:
        if cand.seq is None or cand.seq in shown:
            continue
        cost = cand.cost + (cand.day_cost if cand.day not in days else 0) + (0 if recall else overheads["recall"])
        shown.add(cand.seq)
        if cost > free:
            queue.append(cand)
            continue
        recall.append(replace(cand, spare=True))
        days.add(cand.day)
        free -= cost
    return queue


# -- agent items (tool calls and results): see assembly/agent.py -----------------


_GIVE_UP_ORDER: tuple[LayerName, ...] = ("recall", "key_moments", "summary", "constraints")
"""When the recent turns are all gone and the exact total is still over budget (a counter that
estimates while its server is busy, boundary effects), these layers give up their last item in
this order: memory shrinks, the turn is still answered (never worse than no memory)."""


def _drop_one(chosen: dict[LayerName, list[_Candidate]], dropped: dict[LayerName, list[int]]) -> bool:
    """Drop the oldest recent turn (with the rest of its unit: a call and its results), else the
    last item of the first non-empty layer of `_GIVE_UP_ORDER`; False when nothing is left.
    Turns added with the budget left over (`_spend_leftover`) go first."""
    spare = [c for c in chosen.get("recall", []) if c.spare]
    if spare:
        chosen["recall"].remove(spare[-1])
        if spare[-1].seq is not None:
            dropped["recall"] = [*dropped.get("recall", []), spare[-1].seq]
        return True
    if chosen.get("recent"):
        oldest = min(chosen["recent"], key=lambda c: c.seq or 0)
        gone = [c for c in chosen["recent"] if c is oldest or (c.group is not None and c.group == oldest.group)]
        chosen["recent"] = [c for c in chosen["recent"] if c not in gone]
        dropped["recent"] = [*(c.seq for c in gone if c.seq is not None), *dropped["recent"]]
        return True
    for name in _GIVE_UP_ORDER:
        if chosen.get(name):
            # Constraints are chosen facts-last, and newest first within each kind: the last one goes.
            last = chosen[name].pop()
            if last.seq is not None and name != "constraints":
                dropped[name] = [*dropped.get(name, []), last.seq]
            return True
    return False


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
        lines = [message_line(sent, shape.locale), *(c.line for c in step)]
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
    # Counted as sent: control strings broken in the text and in the calls' arguments.
    calls = tuple(replace(c, arguments=neutralise(c.arguments)) for c in item.tool_calls)
    item = replace(item, text=neutralise(item.text), tool_calls=calls)
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


def _units(cands: Sequence[_Candidate]) -> list[list[_Candidate]]:
    """Recent candidates (newest first) as units kept or dropped whole: a call with its results."""
    units: list[list[_Candidate]] = []
    for c in cands:
        if units and c.group is not None and units[-1][0].group == c.group:
            units[-1].append(c)
        else:
            units.append([c])
    return units


def _plain(c: _Candidate) -> bool:
    return c.turn is not None and c.item is not None and not c.item.tool_calls and c.turn.role != "tool"


def _fill_recent(
    cands: Sequence[_Candidate], limit: int, count: Callable[[str], int],
    chosen: dict[LayerName, list[_Candidate]],
) -> tuple[list[_Candidate], bool]:
    """Recent turns newest first, a unit at a time (a call and its results never split); the
    window stays contiguous and starts with a user message: an answer whose question does not
    fit goes too. A turn recall or the key moments show moves into the window, their tokens
    with it. The newest plain turn alone too big keeps its newest part (an answer only with its
    question whole before it)."""
    elsewhere = {c.seq: c for name in ("key_moments", "recall") for c in chosen.get(name, []) if c.seq is not None}
    units = _units(cands)
    picked: list[list[_Candidate]] = []
    spent = 0
    for unit in units:
        refund = sum(elsewhere[c.seq].cost for c in unit if c.seq in elsewhere)
        cost = sum(c.cost for c in unit)
        if spent + cost > limit + refund:
            break
        picked.append(unit)
        limit += refund
        spent += cost
    if not picked:
        return _clip_newest(units, limit, count)
    picked = _without_orphans(picked)  # no orphaned answer opens the window
    flat = [c for unit in picked for c in unit]
    moved = {c.seq for c in flat if c.seq in elsewhere}
    for name in ("key_moments", "recall"):
        if name in chosen and moved:
            chosen[name] = [c for c in chosen[name] if c.seq not in moved]
    return flat, False


def _without_orphans(picked: list[list[_Candidate]]) -> list[list[_Candidate]]:
    """Never start with an answer (or a call) whose question is missing: the walk stopped at
    the question (it did not fit), or the question was not loaded (a log ending with an
    unanswered message loads its last turns unpaired), so the orphaned units go (their tokens
    to `_spend_leftover`): a strict chat template refuses an answer right after the system
    message. A session that opens with the assistant (a greeting) keeps its opening."""
    while picked and (oldest := picked[-1][-1].turn) is not None and oldest.role != "user" and oldest.seq > 1:
        picked.pop()
    return picked


def _clip_newest(units: Sequence[list[_Candidate]], limit: int, count: Callable[[str], int]) -> tuple[list[_Candidate], bool]:
    """The newest plain turn when it alone does not fit: its newest part; an answer keeps its
    question (the turn before it) whole, or both go."""
    if not units or len(units[0]) != 1 or not _plain(units[0][0]):
        return [], False
    only = units[0][0]
    assert only.turn is not None
    question: _Candidate | None = None
    if only.turn.role != "user":
        before = units[1] if len(units) > 1 else None
        if before is None or len(before) != 1 or not _plain(before[0]) or before[0].turn is None \
                or before[0].turn.role != "user":
            return [], False
        question = before[0]
        limit -= question.cost
    extra = only.cost - count(only.line)
    text = cut_to_tokens(only.line, limit - extra, count) if limit - extra > 0 else ""
    if not text:
        return [], False
    item = AgentItem(turn=only.turn, text=text, group=only.group or 0, elided=True)
    clipped = _Candidate(text, count(text) + extra, only.seq, only.turn, item=item, group=only.group)
    return ([clipped, question] if question is not None else [clipped]), True


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
    """Pick candidates (already in priority order) within ``limit`` tokens: every layer but the
    recent turns (`_fill_recent`); a summary too long keeps its newest part."""
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
        elif name == "summary":
            text = cut_to_tokens(cand.line, limit - 1, count)
            if text:
                picked.append(_Candidate(text, count(text) + 1, cand.seq))
                return picked, True
    return picked, False


@dataclass(frozen=True, kw_only=True)
class _RenderContext:
    """Everything the rendering reads: the frame, the whole layers, the choice, the accounting."""

    frame: _Frame
    message: str
    """The message as the user typed it."""
    sent: str
    """The message as sent (the standalone rewrite when there is one)."""
    strategy: str
    fixed: _Fixed
    selection: _Selection
    """Mutable inside: the oldest recent unit is dropped while the exact total is over budget."""
    allocated: dict[LayerName, int]
    """Each flexible layer's share as shown in the accounting."""
    hint: str | None
    steady: bool = False
    """The window was kept steady (`Context.steady`)."""


@dataclass
class _Rendered:
    """One rendering pass: the non-empty layers, every layer's account, the system sections."""

    layers: list[LayerContent] = field(default_factory=list)
    accounts: dict[LayerName, LayerAccount] = field(default_factory=dict)
    sections: list[str] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)
    """Message form: the sections of the message after the recent turns (`_Frame.tail`)."""

    def add(self, name: LayerName, text: str, frame: _Frame) -> None:
        """A rendered section, into the system message or the message after the turns."""
        (self.tail if name in frame.tail else self.sections).append(text)


def _render(rc: _RenderContext) -> Context:
    """Render every layer in order; while the exact total exceeds the budget (boundary effects,
    an estimating counter), drop the oldest recent unit, then other memory (`_drop_one`), and
    render again. `MessageTooLarge` only when the whole layers alone do not fit."""
    frame = rc.frame
    while True:
        rendered = _render_layers(rc)
        total = _total(rc, rendered)
        if total <= frame.input_budget or not _drop_one(rc.selection.chosen, rc.selection.dropped):
            break
    if total > frame.input_budget:
        raise MessageTooLarge(total, frame.input_budget)
    rendered, total = _top_up(rc, rendered, total)
    return Context(
        layers=tuple(rendered.layers),
        accounts=rendered.accounts,
        message=rc.sent,
        original_message=rc.message,
        format="messages" if frame.as_messages else "text",
        locale=frame.locale,
        strategy=rc.strategy,
        input_budget=frame.input_budget,
        reply_reserve=frame.budget.reserve,
        total_tokens=total,
        exact=frame.counter.exact,
        counter=frame.counter.name,
        order=tuple(frame.order),
        hint=rc.hint,
        steady=rc.steady,
    )


_TOP_UP_TRIES = 6
"""Renderings tried to fit one more left-out turn into what the exact count left free (the
estimates that fill the layers are conservative by a token or two per section)."""


def _top_up(rc: _RenderContext, rendered: _Rendered, total: int) -> tuple[_Rendered, int]:
    """Left-out turns (`_Selection.queue`, best first) added as recall lines while the exact
    total still has room for them."""
    selection, budget = rc.selection, rc.frame.input_budget
    tries = 0
    while selection.queue and tries < _TOP_UP_TRIES and total < budget:
        cand = selection.queue.pop(0)
        recall = selection.chosen.setdefault("recall", [])
        heading = cand.day_cost if cand.day not in {c.day for c in recall} else 0
        if cand.cost + heading > budget - total:
            continue
        tries += 1
        recall.append(replace(cand, spare=True))
        before = {name: list(seqs) for name, seqs in selection.dropped.items()}
        for seqs in selection.dropped.values():
            seqs[:] = [seq for seq in seqs if seq != cand.seq]
        trial = _render_layers(rc)
        trial_total = _total(rc, trial)
        if trial_total <= budget:
            rendered, total = trial, trial_total
        else:
            recall.pop()
            for name, seqs in before.items():
                selection.dropped[name][:] = seqs
    return rendered, total


def _render_layers(rc: _RenderContext) -> _Rendered:
    out = _Rendered()
    for name in rc.frame.order:
        title = layer_title(name, rc.frame.locale)
        if name in rc.fixed.sections:
            _render_fixed(name, title, rc, out)
        elif name == "current":
            _render_current(title, rc, out)
        elif name in rc.selection.chosen:
            _render_flexible(name, title, rc, out)
    return out


def _total(rc: _RenderContext, rendered: _Rendered) -> int:
    """Tokens of the whole rendered input, chat-format overhead included."""
    frame = rc.frame
    if not frame.as_messages:
        return frame.count(SECTION_SEPARATOR.join(rendered.sections))
    system_content = SECTION_SEPARATOR.join(rendered.sections)
    total = (frame.count(system_content) + message_overhead(frame.counter, "system") if system_content else 0)
    tail_content = SECTION_SEPARATOR.join(rendered.tail)
    total += frame.count(tail_content) + message_overhead(frame.counter, "user") if tail_content else 0
    total += sum(c.cost for c in rc.selection.chosen.get("recent", []))
    return total + rc.fixed.current_cost


def _render_fixed(name: LayerName, title: str, rc: _RenderContext, out: _Rendered) -> None:
    """The system prompt or the reply format: one item, always whole."""
    text = rc.fixed.sections[name]
    used = rc.frame.count(text) + rc.frame.sep_cost
    allocated = rc.frame.budget.allocations.get(name, rc.fixed.costs[name])
    out.layers.append(LayerContent(name=name, title=title, items=(LayerItem(text=text, tokens=used),), rendered=text))
    out.accounts[name] = LayerAccount(name=name, allocated=allocated, used=used, items=1)
    out.add(name, text, rc.frame)


def _render_current(title: str, rc: _RenderContext, out: _Rendered) -> None:
    """The message as sent, then the agent step's calls and results."""
    fixed, as_messages = rc.fixed, rc.frame.as_messages
    step_cost = sum(c.cost for c in fixed.step)
    items: tuple[LayerItem, ...] = (
        LayerItem(text=rc.sent, tokens=fixed.current_cost - step_cost, role="user"),
        *(_layer_item(c, c.line) for c in fixed.step),
    )
    out.layers.append(LayerContent(name="current", title=title, items=items,
                                   rendered="" if as_messages else fixed.current_text))
    out.accounts["current"] = LayerAccount(name="current", allocated=fixed.current_cost, used=fixed.current_cost,
                                           items=len(items))
    if not as_messages:
        out.sections.append(fixed.current_text)


def _render_flexible(name: LayerName, title: str, rc: _RenderContext, out: _Rendered) -> None:
    """A flexible layer's chosen items (its account even when nothing was chosen)."""
    frame, selection = rc.frame, rc.selection
    picked = _shown_order(name, selection.chosen[name])
    allocated = rc.allocated.get(name, 0)
    dropped = selection.dropped[name]
    if not picked:
        if allocated or dropped:
            out.accounts[name] = LayerAccount(name=name, allocated=allocated, used=0, dropped_seqs=tuple(dropped))
        return
    if name == "recent" and frame.as_messages:
        items = tuple(_layer_item(c, c.line) for c in picked)
        used = sum(c.cost for c in picked)
        text = ""
    else:
        lines = _section_lines(name, picked, frame.locale)
        text = section_text(name, title, lines)
        out.add(name, text, frame)
        used = frame.count(text) + frame.sep_cost
        items = tuple(
            LayerItem(text=line, tokens=c.cost, seq=c.seq, role=c.turn.role if c.turn else None,
                      created_at=c.turn.created_at if c.turn else None)
            for line, c in zip(lines, picked, strict=True)
        )
    out.layers.append(LayerContent(name=name, title=title, items=items, rendered=text))
    out.accounts[name] = LayerAccount(
        name=name, allocated=max(allocated, used), used=used, items=len(items),
        dropped_seqs=tuple(dropped), truncated=selection.truncated[name],
    )


def _shown_order(name: LayerName, picked: list[_Candidate]) -> list[_Candidate]:
    """Turns and constraints shown oldest first (recall: day by day, so each day heading
    appears once); each recent answer right after the message it answers, even if turns
    were stored interleaved."""
    if name in ("key_moments", "recall", "recent", "constraints"):
        picked = sorted(picked, key=lambda c: (c.day or "", c.seq or 0))
    if name == "recent":
        position = {t.seq: i for i, t in enumerate(paired_turns([c.turn for c in picked if c.turn]))}
        picked = sorted(picked, key=lambda c: position.get(c.seq or 0, -1))
    return picked


def _section_lines(name: LayerName, picked: Sequence[_Candidate], locale: str) -> list[str]:
    """A layer's lines in text form (recall: a day heading before each day's first line)."""
    if name == "recent":
        return [_agent_line(c.item, locale) if c.item else c.line for c in picked]
    lines = [c.line for c in picked]
    if any(c.day for c in picked):
        lines = [
            f"{c.day}\n{line}" if c.day and (i == 0 or picked[i - 1].day != c.day) else line
            for i, (c, line) in enumerate(zip(picked, lines, strict=True))
        ]
    return lines
