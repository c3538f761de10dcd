"""Assembly never breaks an agent's history: call/result units whole, system prompt and the
latest user turn present, pins kept, and the exact token count within budget."""

from __future__ import annotations

import functools
import json
import os
import random
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextmode.assembly import AssemblyConfig, CurrentTurn, assemble, to_messages
from contextmode.assembly.agent import agent_units, elide, split_step, step_items, tool_sentence
from contextmode.assembly.assemble import _cached_count
from contextmode.errors import MessageTooLarge
from contextmode.memory.budget import Budget
from contextmode.memory.strategies import STRATEGIES
from contextmode.testing.agents import pairing_errors
from contextmode.tokens import count_messages, count_turn, counter_for_encoding
from contextmode.tokens.tools import message_overhead
from contextmode.types import Constraint, SessionState, Summary, ToolCall, Turn, tool_metadata

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
EN = ["Find the cheapest flight to Lisbon next week.", "What did the log say about the timeout?",
      "Summarise the report for me.", "Thanks, now compare it with last year."]
ZH = ["帮我查一下下周去里斯本最便宜的机票。", "日志里关于超时说了什么？", "帮我总结一下这份报告。", "谢谢，再和去年比较一下。"]
PINS = [("budget", "预算50元以内"), ("spice", "不要辣"), ("lang", "answer in English"), ("name", "call me Ana")]


class _Counter:
    """The exact o200k counter with counts cached (the big results repeat); long texts are
    cached by hash so the cache stays small across 10,000 examples."""

    def __init__(self) -> None:
        inner = counter_for_encoding("o200k_base")
        self.name, self.exact = inner.name, inner.exact
        self.message_overhead, self.reply_overhead = inner.message_overhead, inner.reply_overhead
        self.role_overheads = inner.role_overheads  # type: ignore[attr-defined]
        self._short = functools.lru_cache(maxsize=16384)(inner.count)
        self._long: dict[tuple[int, int], int] = {}
        self._inner = inner

    def count(self, text: str) -> int:
        if len(text) <= 2048:
            return self._short(text)
        key = (hash(text), len(text))
        if key not in self._long:
            if len(self._long) > 4096:
                self._long.clear()
            self._long[key] = self._inner.count(text)
        return self._long[key]


@functools.cache
def counter() -> _Counter:
    return _Counter()


@functools.cache
def big_result(zh: bool, variant: int) -> str:
    """A ~50k-token tool result (a search dump or a file), built once."""
    rng = random.Random(variant * 2 + zh)
    words = ZH if zh else EN
    lines = [f"{i:05d} {rng.choice(words)} id={rng.randrange(10**6)}" for i in range(5200 if zh else 4200)]
    return "\n".join(lines)


def _result_text(kind: int, zh: bool, variant: int) -> str:
    if kind == 2:
        return big_result(zh, variant % 3)
    if kind == 1:
        return json.dumps({"rows": [{"city": "里斯本" if zh else "Lisbon", "price": 100 + i} for i in range(40)]},
                          ensure_ascii=False)
    return ("结果：" if zh else "Result: ") + (ZH if zh else EN)[variant % 4]


def _turn(seq: int, role: str, content: str, meta: dict[str, object] | None = None) -> Turn:
    meta = meta or {}
    calls = tuple(ToolCall(**c) for c in meta.get("tool_calls", ()))  # type: ignore[attr-defined]
    tokens = count_turn(counter(), content, tool_calls=calls, tool_result=role == "tool")  # type: ignore[arg-type]
    return Turn(seq=seq, role=role, content=content, tokens=tokens,  # type: ignore[arg-type]
                created_at=T0 + timedelta(minutes=seq), metadata=meta)


def build_conversation(seed: int, zh: bool, n_exchanges: int, big_share: int) -> tuple[list[Turn], str | None]:
    """A log of exchanges (user, agent rounds of parallel calls and results, answer) and the
    next user message, or ``None`` when the log ends inside an agent step. ``big_share`` in
    tenths: how often a result is a 50k-token dump."""
    rng = random.Random(seed)
    words = ZH if zh else EN
    turns: list[Turn] = []
    for x in range(n_exchanges):
        turns.append(_turn(len(turns) + 1, "user", rng.choice(words)))
        last = x == n_exchanges - 1
        for _ in range(rng.randint(0, 3)):
            calls = [ToolCall(id=f"call_{len(turns)}_{k}", name=rng.choice(["search", "read_file", "sql"]),
                              arguments=json.dumps({"q": words[k % 4]}, ensure_ascii=False))
                     for k in range(rng.randint(1, 4))]
            said = rng.choice(["", "让我查一下。" if zh else "Let me check."])
            turns.append(_turn(len(turns) + 1, "assistant", said, tool_metadata(tool_calls=calls)))
            if rng.randrange(10) == 0 and not last:
                break  # abandoned: the results never came, the user spoke again
            rng.shuffle(calls)  # parallel results come back in any order
            for call in calls:
                kind = 2 if rng.randrange(10) < big_share else rng.randint(0, 1)
                text = _result_text(kind, zh, rng.randrange(6))
                turns.append(_turn(len(turns) + 1, "tool", text, tool_metadata(tool_call_id=call.id, tool_name=call.name)))
        if last and turns[-1].role == "tool" and rng.random() < 0.5:
            return turns, None  # the client sends the results: the model continues the step
        turns.append(_turn(len(turns) + 1, "assistant", ("好的，" if zh else "Done: ") + words[x % 4]))
    return turns, rng.choice(words)


conversations = st.builds(build_conversation, st.integers(0, 2**32), st.booleans(), st.integers(1, 8),
                          st.integers(0, 4))


def _state(history: Sequence[Turn], draw_summary: int, pins: int, strategy_recent: int) -> SessionState:
    covers = min(draw_summary, max(0, len(history) - 2))
    summary = Summary(text="The user asked about flights and logs; search returned prices.",
                      covers_seq=history[covers - 1].seq, tokens=12) if covers else None
    window = list(history[-max(strategy_recent, len(history) - covers, 1):]) if history else []
    first_shown = window[0].seq if window else len(history) + 1
    older = [t for t in history if t.seq < first_shown]
    return SessionState(
        tenant="t", session_id="s", last_seq=history[-1].seq if history else 0, turns=tuple(window), summary=summary,
        constraints=tuple(Constraint(key=k, value=v, source_seq=1) for k, v in PINS[:pins]),
        key_moments=tuple(t for t in older if t.role == "user")[:2],
        recalled=tuple(t for t in older if t.role == "tool")[:2],
    )


def check(turns: list[Turn], next_message: str | None, strategy: str, budget_tokens: int,
          summary_at: int, pins: int, fmt: str) -> str:
    """Assemble and check every invariant; returns ``ok`` or ``too_large`` (honestly too large)."""
    c = counter()
    if next_message is None:
        history, user, step = split_step(turns)
        assert user is not None
        message = user.content
    else:
        history, step, message = turns, [], next_message
    chosen = STRATEGIES[strategy]()
    state = _state(history, summary_at, pins, chosen.recent_turns)
    budget = Budget(context_window=budget_tokens + 256, reply_reserve=256)
    config = AssemblyConfig(format=fmt)  # type: ignore[arg-type]
    try:
        ctx = assemble(state, message, counter=c, strategy=chosen, budget=budget, config=config,  # type: ignore[arg-type]
                       now=T0 + timedelta(days=1), current=CurrentTurn(agent_step=step))
    except MessageTooLarge:
        # Only when the message, the system prompt and the step cut to bare markers cannot fit.
        assert _floor(message, step, ctx_locale(message, step), fmt) > budget.input_tokens
        return "too_large"
    messages = to_messages(ctx)
    if fmt == "text":
        assert ctx.total_tokens == c.count(messages[0].content) <= budget.input_tokens
        assert message in messages[0].content
        return "ok"
    assert pairing_errors(messages) == []
    assert messages[0].role == "system" and ctx.layer("system") is not None
    users = [m for m in messages if m.role == "user"]
    assert users and users[-1].content == message
    last_user = max(i for i, m in enumerate(messages) if m.role == "user")
    after = messages[last_user + 1:]
    assert [m.role for m in after] == [m.role for m in _expected_step(step)]
    exact = count_messages(c, messages)  # type: ignore[arg-type]
    assert exact == ctx.total_tokens <= budget.input_tokens
    pinned = ctx.accounts.get("constraints")
    recent = ctx.layer("recent")
    if strategy == "steady" and recent is not None and any(item.seq == 1 for item in recent.items):
        # A steady window holds the turn the pins were said in (seq 1) verbatim: they are left to it.
        return "pins_in_window"
    if pins and (pinned.items if pinned else 0) < pins:
        # Only when the current agent step, cut to bare markers, leaves no room for them.
        current = ctx.layer("current")
        assert current is not None and step
        floor = step_items(step, 0, counter=c, count=_cached_count(c), zh=ctx.locale.startswith("zh"))[1]  # type: ignore[arg-type]
        assert sum(i.tokens for i in current.items[1:]) == floor, "a pinned constraint was dropped"
        return "pins_crowded"
    return "ok"


def _expected_step(step: Sequence[Turn]) -> list[Turn]:
    return [t for unit in agent_units(step) for t in unit] if step else []


def ctx_locale(message: str, step: Sequence[Turn]) -> str:
    from contextmode.text import is_chinese

    return "zh" if is_chinese(message) else "en"


def _floor(message: str, step: Sequence[Turn], locale: str, fmt: str) -> int:
    """The least the request can cost: system prompt, message, and the step cut to bare markers."""
    from contextmode.assembly.render import DEFAULT_SYSTEM_PROMPT
    from contextmode.types import ChatMessage

    c = counter()
    cut = step_items(step, 0, counter=c, count=_cached_count(c), zh=locale == "zh")[1]  # type: ignore[arg-type]
    head = [ChatMessage(role="system", content=DEFAULT_SYSTEM_PROMPT[locale]), ChatMessage(role="user", content=message)]
    return count_messages(c, head) + cut  # type: ignore[arg-type]


STRATEGY_NAMES = sorted(STRATEGIES)
AGENT_EXAMPLES = int(os.environ.get("CONTEXTMODE_AGENT_EXAMPLES", "10000"))
"""10,000 generated conversations in CI; fewer for a quick local look."""
_budgets = st.one_of(st.integers(500, 2000), st.integers(2000, 32_000))


@pytest.mark.slow
@settings(max_examples=AGENT_EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(conversations, st.sampled_from(STRATEGY_NAMES), _budgets, st.integers(0, 20), st.integers(0, 3),
       st.sampled_from(["messages", "messages", "messages", "text"]))
def test_agent_invariants_hold_for_every_strategy_and_budget(
    conv: tuple[list[Turn], str | None], strategy: str, budget_tokens: int, summary_at: int, pins: int, fmt: str
) -> None:
    turns, next_message = conv
    check(turns, next_message, strategy, budget_tokens, summary_at, pins, fmt)


def test_units_drop_orphan_results_and_unanswered_calls() -> None:
    call = ToolCall(id="a", name="search", arguments='{"q": "x"}')
    turns = [
        _turn(1, "tool", "orphan", tool_metadata(tool_call_id="zzz")),
        _turn(2, "assistant", "", tool_metadata(tool_calls=[call, ToolCall(id="b", name="sql")])),
        _turn(3, "tool", "only a", tool_metadata(tool_call_id="a")),
        _turn(4, "user", "hi"),
    ]
    units = agent_units(turns)
    assert [[t.seq for t in u] for u in units] == [[2, 3], [4]]
    state = SessionState(tenant="t", session_id="s", last_seq=4, turns=tuple(turns))
    ctx = assemble(state, "next", counter=counter(), strategy="token_window")  # type: ignore[arg-type]
    messages = to_messages(ctx)
    assert pairing_errors(messages) == []
    assert [m.role for m in messages] == ["system", "user", "user"]  # the empty unanswered call is gone


def test_old_big_results_are_elided_with_a_marker_and_the_latest_step_is_whole() -> None:
    big = big_result(False, 0)
    call = ToolCall(id="c1", name="read_file", arguments='{"path": "a.log"}')
    old = [_turn(1, "user", "read it"), _turn(2, "assistant", "", tool_metadata(tool_calls=[call])),
           _turn(3, "tool", big, tool_metadata(tool_call_id="c1", tool_name="read_file")), _turn(4, "assistant", "ok")]
    call2 = ToolCall(id="c2", name="search", arguments='{"q": "timeout"}')
    step = [_turn(6, "assistant", "", tool_metadata(tool_calls=[call2])),
            _turn(7, "tool", "timeout at 12:03", tool_metadata(tool_call_id="c2"))]
    state = SessionState(tenant="t", session_id="s", last_seq=4, turns=tuple(old))
    config = AssemblyConfig(tool_limits=__import__("contextmode.assembly.agent", fromlist=["ToolLimits"]).ToolLimits(
        per_tool={"read_file": 300}))
    ctx = assemble(state, "what timed out?", counter=counter(), strategy="token_window",  # type: ignore[arg-type]
                   budget=Budget(context_window=100_000, reply_reserve=1000), config=config, current=CurrentTurn(agent_step=step))
    messages = to_messages(ctx)
    tool_msgs = [m for m in messages if m.role == "tool"]
    assert "stored as turn 3" in tool_msgs[0].content
    assert tool_msgs[0].content.startswith(big[:20]) and tool_msgs[0].content.endswith(big[-20:])
    assert counter().count(tool_msgs[0].content) <= 300
    assert tool_msgs[1].content == "timeout at 12:03"  # the latest result whole
    assert messages[-1].role == "tool" and messages[-3].content == "what timed out?"


def test_latest_result_is_cut_only_when_the_budget_demands() -> None:
    big = big_result(True, 1)
    call = ToolCall(id="c1", name="search", arguments='{"q": "x"}')
    step = [_turn(2, "assistant", "", tool_metadata(tool_calls=[call])),
            _turn(3, "tool", big, tool_metadata(tool_call_id="c1"))]
    state = SessionState(tenant="t", session_id="s", last_seq=1, turns=())
    ctx = assemble(state, "查一下", counter=counter(), strategy="window",  # type: ignore[arg-type]
                   budget=Budget(context_window=4000, reply_reserve=500), current=CurrentTurn(agent_step=step))
    messages = to_messages(ctx)
    assert "第 3 轮" in messages[-1].content
    assert count_messages(counter(), messages) == ctx.total_tokens <= 3500  # type: ignore[arg-type]


def test_tool_items_read_as_sentences_not_json() -> None:
    call = _turn(1, "assistant", "", tool_metadata(tool_calls=[ToolCall(id="a", name="search", arguments='{"q": "lisbon", "n": 3}')]))
    assert tool_sentence(call, zh=False) == "Called search(q “lisbon”, n 3)."
    result = _turn(2, "tool", '{"rows": [1, 2]}', tool_metadata(tool_call_id="a", tool_name="search"))
    assert tool_sentence(result, zh=True) == "search 返回：rows 2 items"
    assert "{" not in tool_sentence(result, zh=False)


def test_tool_tokens_include_arguments_and_family_markers() -> None:
    c = counter()
    calls = (ToolCall(id="x", name="search", arguments='{"q": "a long query about lisbon flights"}'),)
    assert count_turn(c, "", tool_calls=calls) > c.count(calls[0].arguments)  # type: ignore[arg-type]
    qwen = counter_for_encoding("estimate:qwen2")
    assert count_turn(qwen, "r", tool_result=True) > qwen.count("r")
    assert message_overhead(c, "tool") == c.role_overheads["user"]  # type: ignore[arg-type]


def test_elide_keeps_head_and_tail_within_the_limit() -> None:
    c = counter()
    text = big_result(False, 2)
    out = elide(text, c.count(text), 200, c.count, seq=9, zh=False)
    assert c.count(out) <= 200 and out.startswith(text[:10]) and out.endswith(text[-10:]) and "turn 9" in out
    assert elide("short", 1, 200, c.count, seq=1, zh=False) == "short"


def test_other_adapters_carry_tool_items_as_text() -> None:
    from contextmode.assembly import to_anthropic, to_text

    call = ToolCall(id="c1", name="search", arguments='{"q": "x"}')
    turns = [_turn(1, "user", "find x"), _turn(2, "assistant", "", tool_metadata(tool_calls=[call])),
             _turn(3, "tool", "x is 42", tool_metadata(tool_call_id="c1", tool_name="search")),
             _turn(4, "assistant", "It is 42.")]
    state = SessionState(tenant="t", session_id="s", last_seq=4, turns=tuple(turns))
    ctx = assemble(state, "thanks", counter=counter(), strategy="token_window")  # type: ignore[arg-type]
    anthropic = to_anthropic(ctx)
    assert {m["role"] for m in anthropic["messages"]} <= {"user", "assistant"}
    assert "search" in anthropic["messages"][1]["content"] and "[c1] x is 42" in anthropic["messages"][2]["content"]
    text_ctx = assemble(state, "thanks", counter=counter(), strategy="token_window",  # type: ignore[arg-type]
                        config=AssemblyConfig(format="text"))
    text = to_text(text_ctx)
    assert "Called search(q “x”)." in text and "Tool result: x is 42" in text
