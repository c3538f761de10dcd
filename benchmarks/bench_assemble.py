"""Assembling a context costs the same at 100,000 stored turns as at 100.

Run: ``python benchmarks/bench_assemble.py`` (``--quick`` for fewer repetitions,
``--no-frameworks`` to skip LangChain / LlamaIndex even when installed).

What is timed (median over many calls, milliseconds):

- ``assemble()`` alone, on the `SessionState` that ``MemoryStore.load()`` returns
  for a session of 100 and of 100,000 turns (the uncovered tail, the summary,
  key moments for hybrid), with the default ``sliding_summary`` strategy and
  default `Budget`, and with ``hybrid``;
- the whole path ``load()`` + ``assemble()`` from a `MemoryStore` and from a
  `SQLiteStore` holding 100 and 100,000 turns;
- for comparison, when the ``bench`` extra is installed: LangChain
  ``trim_messages`` and LlamaIndex ``ChatMemoryBuffer.get()`` over the same
  histories, with the same exact tokenizer and the same input budget. Those
  walk the whole history on every call, so large sizes are skipped when one
  call is predicted to take more than 30 s.

- tool-heavy agent histories (``--tools-only`` runs just these): a log of 100 and
  of 100,000 items where assistant turns make one to three parallel tool calls
  and the results come back, one in ten of them a 5k–50k-token dump (a file, a
  search page); ``assemble()`` with the default strategy, both on a log that
  ends with a user message and on one that ends inside an agent step (the
  latest results after the latest user turn). Old big results are elided,
  units of a call and its results are kept whole.

Turns are realistic mixed Chinese/English chat (short user turns, longer
answers), counted once with the exact o200k counter during setup, as the
store keeps them. Each assemble call gets a new message (so the current
message is never cached); the summary and system prompt repeat from call to
call, as they do in a real session. The last line is a JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from contextmode.assembly import CurrentTurn, assemble
from contextmode.assembly.agent import split_step
from contextmode.memory import Budget, get_strategy
from contextmode.store.memory import MemoryStore
from contextmode.store.sqlite import SQLiteStore
from contextmode.tokens import TokenCounter, count_turn, counter_for_model
from contextmode.types import (
    NewTurn,
    Role,
    SessionKey,
    SessionState,
    Summary,
    ToolCall,
    tool_metadata,
)

SIZES = (100, 100_000)
TENANT, SESSION = "bench", "s1"
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
SLOW_CALL_LIMIT_S = 30.0
FRAMEWORK_TIME_BUDGET_S = 20.0  # per framework and size, repetitions beyond one

ZH_USER = ["我最近工作压力很大，晚上总是睡不好。", "能不能推荐一家不辣的餐厅？预算五十元以内。",
           "刚才说的那个方案，你给个代码呗。", "今天又是那种感觉，心里空落落的。",
           "周末想带孩子去公园，天气怎么样？", "帮我把这段话翻译成英文。", "举个例子吧。"]
EN_USER = ["Can you summarise the meeting notes from yesterday?", "I'm vegetarian, keep that in mind.",
           "What did you say about the deployment plan?", "Give me an example in Python.",
           "I feel anxious about the interview tomorrow.", "Make it simpler please."]
ZH_ANSWER = ["好的，我理解你的感受。压力大的时候，可以试试睡前散步二十分钟，减少咖啡因的摄入，",
             "根据你的预算，我推荐附近的一家粤菜馆，人均四十五元，菜品清淡，适合不吃辣的朋友。",
             "这个方案分三步：先整理需求，再设计数据结构，最后写接口和测试。下面是示例代码：",
             "周末天气晴，气温二十度左右，适合户外活动，记得带水和防晒用品。"]
EN_ANSWER = ["Sure. The meeting covered three points: the release date, the budget and hiring. ",
             "Here is a short example:\n```python\ndef greet(name):\n    return f'hello {name}'\n```\n",
             "Interviews are stressful; prepare two stories about past projects and sleep early. ",
             "The deployment plan has a canary stage, then 10% of traffic, then everyone. "]
MESSAGES = ["那我今天应该怎么做？", "What should I do next?", "再详细说说第二点。", "ok, and then?"]


def make_turns(n: int, rng: random.Random) -> list[NewTurn]:
    """``n`` alternating user/assistant turns, half Chinese, half English, 25 % emotional."""
    start = NOW - timedelta(minutes=2 * n)
    turns = []
    for i in range(n):
        zh = rng.random() < 0.5
        role: Role
        if i % 2 == 0:
            text = rng.choice(ZH_USER if zh else EN_USER) + f" (#{i})"
            role = "user"
        else:
            pool = ZH_ANSWER if zh else EN_ANSWER
            text = "".join(rng.choice(pool) for _ in range(rng.randint(1, 6))) + f" [{i}]"
            role = "assistant"
        # A quarter of the turns are emotional, so the 100-turn session also has the
        # 20 key-moment candidates hybrid fetches: both sizes do the same work.
        emotion = round(rng.uniform(0.71, 1.0), 2) if rng.random() < 0.25 else rng.uniform(0, 0.6)
        turns.append(NewTurn(role=role, content=text, tokens=0,  # counted below
                             created_at=start + timedelta(minutes=2 * i), emotion=emotion))
    return turns


def count_once(turns: list[NewTurn], counter: TokenCounter) -> list[NewTurn]:
    return [NewTurn(role=t.role, content=t.content, tokens=counter.count(t.content),
                    created_at=t.created_at, emotion=t.emotion) for t in turns]


def summary_for(n: int, counter: TokenCounter) -> Summary:
    text = ("用户在工作压力与睡眠问题之间反复，偏好清淡饮食，预算五十元以内；"
            "The user is vegetarian and prepares for an interview. ") * 6
    # A background job lags a few turns behind the newest one.
    return Summary(text=text, covers_seq=max(0, n - 12), tokens=counter.count(text))


async def fill(store: Any, turns: list[NewTurn], counter: TokenCounter) -> None:
    for i in range(0, len(turns), 5000):
        await store.append(SessionKey(TENANT, SESSION), turns[i : i + 5000])
    summary = summary_for(len(turns), counter)
    if summary.covers_seq:
        await store.commit_summary(SessionKey(TENANT, SESSION), summary, expected_version=0)


def median_ms(samples_ns: Sequence[int]) -> float:
    return statistics.median(samples_ns) / 1e6


def time_assemble(state: SessionState, counter: TokenCounter, strategy: str, reps: int) -> float:
    budget = Budget()
    samples = []
    for i in range(reps):
        message = f"{MESSAGES[i % len(MESSAGES)]} {i}"
        t0 = time.perf_counter_ns()
        assemble(state, message, counter=counter, strategy=strategy, budget=budget, now=NOW)
        samples.append(time.perf_counter_ns() - t0)
    return median_ms(samples)


async def load_state(store: Any, strategy_name: str) -> SessionState:
    strategy = get_strategy(strategy_name)
    state: SessionState = await store.load(SessionKey(TENANT, SESSION), recent=strategy.recent_turns,
                                           key_moments=strategy.key_moment_limit)
    return state


async def time_whole_path(store: Any, counter: TokenCounter, strategy: str, reps: int) -> float:
    budget = Budget()
    samples = []
    for i in range(reps):
        message = f"{MESSAGES[i % len(MESSAGES)]} {i}"
        t0 = time.perf_counter_ns()
        state = await load_state(store, strategy)
        assemble(state, message, counter=counter, strategy=strategy, budget=budget, now=NOW)
        samples.append(time.perf_counter_ns() - t0)
    return median_ms(samples)


# -- tool-heavy agent histories -------------------------------------------------------

TOOL_NAMES = ("search", "read_file", "sql")


def big_results(counter: TokenCounter, rng: random.Random) -> list[tuple[str, int]]:
    """A few 5k–50k-token dumps (counted once; the log reuses them, as the store would keep copies)."""
    out = []
    for size in (5_000, 20_000, 50_000):
        for pool in (ZH_ANSWER, EN_ANSWER):
            text = ""
            while len(text) < size * 2:
                text += rng.choice(pool) + f" id={rng.randrange(10**6)}\n"
            out.append((text, counter.count(text)))
    return out


def make_agent_turns(n: int, rng: random.Random, counter: TokenCounter) -> list[NewTurn]:
    """``n`` items: user turns, assistant turns with 1–3 parallel tool calls, their results
    (one in ten a big dump) and answers; counted with the exact counter (cached by content)."""
    counts: dict[str, int] = {}
    dumps = big_results(counter, rng)
    start = NOW - timedelta(minutes=n)
    turns: list[NewTurn] = []

    def add(role: Role, text: str, meta: dict[str, Any], calls: Sequence[ToolCall] = ()) -> None:
        key = text if not calls else text + "".join(c.name + c.arguments for c in calls)
        if key not in counts:
            counts[key] = count_turn(counter, text, tool_calls=calls, tool_result=role == "tool")
        turns.append(NewTurn(role=role, content=text, tokens=counts[key], metadata=meta,
                             created_at=start + timedelta(minutes=len(turns))))

    while len(turns) < n:
        zh = rng.random() < 0.5
        add("user", rng.choice(ZH_USER if zh else EN_USER), {})
        for _ in range(rng.randint(1, 3)):
            calls = [ToolCall(id=f"call_{len(turns)}_{k}", name=rng.choice(TOOL_NAMES),
                              arguments=json.dumps({"q": rng.choice(MESSAGES)}, ensure_ascii=False))
                     for k in range(rng.randint(1, 3))]
            add("assistant", "", tool_metadata(tool_calls=calls), calls)
            for call in calls:
                text = rng.choice(dumps)[0] if rng.random() < 0.1 else rng.choice(ZH_ANSWER if zh else EN_ANSWER)
                add("tool", text, tool_metadata(tool_call_id=call.id, tool_name=call.name))
        add("assistant", rng.choice(ZH_ANSWER if zh else EN_ANSWER), {})
    turns = turns[:n]
    while turns[-1].role != "tool":  # end inside an agent step: results after the latest user turn
        turns.pop()
    return turns


def time_agent_assemble(state: SessionState, counter: TokenCounter, reps: int, *, in_step: bool) -> float:
    """Median ms of ``assemble()`` on a tool-heavy state: a new message, or the step continuing."""
    budget = Budget()
    samples = []
    history, user, step = split_step(state.turns)
    step_state = SessionState(tenant=state.tenant, session_id=state.session_id, last_seq=state.last_seq,
                              turns=tuple(history), summary=state.summary)
    for i in range(reps):
        t0 = time.perf_counter_ns()
        if in_step and user is not None:
            assemble(step_state, user.content, counter=counter, budget=budget, now=NOW, current=CurrentTurn(agent_step=step))
        else:
            assemble(state, f"{MESSAGES[i % len(MESSAGES)]} {i}", counter=counter, budget=budget, now=NOW)
        samples.append(time.perf_counter_ns() - t0)
    return median_ms(samples)


async def agent_rows(counter: TokenCounter, reps: int, out: dict[str, Any]) -> list[tuple[str, int, str, str]]:
    rows: list[tuple[str, int, str, str]] = []
    log = make_agent_turns(max(SIZES), random.Random(7), counter)
    medians: dict[tuple[str, int], float] = {}
    for n in SIZES:
        # Both sizes end with the same items: only the length of the history differs.
        items = log[-n:]
        memory = MemoryStore()
        await fill(memory, items, counter)
        state = await load_state(memory, "sliding_summary")
        for label, in_step in (("new message", False), ("inside a step", True)):
            ms = time_agent_assemble(state, counter, reps, in_step=in_step)
            medians[(label, n)] = ms
            rows.append((f"assemble() tool-heavy, {label}", len(items), f"{ms:.3f}",
                         f"{sum(t.role == 'tool' for t in items):,} results in the log"))
    small, big = SIZES
    for label in ("new message", "inside a step"):
        key = label.replace(" ", "_")
        out[f"tools_median_ms_{key}_{small}"] = round(medians[(label, small)], 4)
        out[f"tools_median_ms_{key}_{big}"] = round(medians[(label, big)], 4)
        out[f"tools_ratio_{key}"] = round(medians[(label, big)] / medians[(label, small)], 3)
    return rows


# -- other libraries ------------------------------------------------------------------


def _timed_calls(call: Callable[[], object]) -> tuple[float, int]:
    """Median of as many calls (1 to 50) as fit in the time budget, judged by the first."""
    samples: list[int] = []
    while True:
        t0 = time.perf_counter_ns()
        call()
        samples.append(time.perf_counter_ns() - t0)
        if len(samples) >= 50 or sum(samples) / 1e9 + samples[0] / 1e9 > FRAMEWORK_TIME_BUDGET_S:
            return median_ms(samples), len(samples)


def framework_rows(histories: dict[int, list[NewTurn]], counter: TokenCounter,
                   out: dict[str, Any]) -> list[tuple[str, int, str, str]]:
    rows: list[tuple[str, int, str, str]] = []
    budget = Budget().input_tokens
    # Plain tiktoken, as a user of these libraries would pass it (not our LRU-cached wrapper,
    # whose hit rate would depend on the history size).
    counter = getattr(counter, "inner", counter)
    runners: list[tuple[str, Callable[[list[NewTurn]], Callable[[], object]]]] = []
    try:
        from langchain_core.messages import (
            AIMessage,
            BaseMessage,
            HumanMessage,
            SystemMessage,
            trim_messages,
        )

        def lc_counter(messages: list[BaseMessage]) -> int:
            return sum(counter.count(str(m.content)) + counter.message_overhead for m in messages)

        def langchain(turns: list[NewTurn]) -> Callable[[], object]:
            msgs: list[BaseMessage] = [SystemMessage("You are a helpful assistant.")]
            msgs += [HumanMessage(t.content) if t.role == "user" else AIMessage(t.content) for t in turns]
            return lambda: trim_messages(msgs, max_tokens=budget, token_counter=lc_counter,
                                         strategy="last", start_on="human", include_system=True)

        runners.append(("langchain trim_messages", langchain))
    except ImportError:
        out["langchain"] = "not installed (pip install 'contextmode-engine[bench]')"
    try:
        from llama_index.core.llms import ChatMessage as LlamaMessage
        from llama_index.core.memory import ChatMemoryBuffer

        def tokenize(text: str) -> list[int]:  # LlamaIndex only takes len() of this
            return [0] * counter.count(text)

        def llamaindex(turns: list[NewTurn]) -> Callable[[], object]:
            history = [LlamaMessage(role=t.role, content=t.content) for t in turns]
            memory = ChatMemoryBuffer.from_defaults(chat_history=history, token_limit=budget,
                                                    tokenizer_fn=tokenize)
            return memory.get

        runners.append(("llamaindex ChatMemoryBuffer.get", llamaindex))
    except ImportError:
        out["llamaindex"] = "not installed (pip install 'contextmode-engine[bench]')"

    for name, build in runners:
        key = name.split()[0]
        measured: dict[int, float] = {}
        for size in sorted(histories):
            # Predict one call at this size from the growth seen so far (at least linear).
            predicted = 0.0
            if measured:
                sizes = sorted(measured)
                exponent = 1.0
                if len(sizes) >= 2 and measured[sizes[-2]] > 0:
                    exponent = max(1.0, math.log(measured[sizes[-1]] / measured[sizes[-2]])
                                   / math.log(sizes[-1] / sizes[-2]))
                predicted = measured[sizes[-1]] / 1000 * (size / sizes[-1]) ** exponent
            if predicted > SLOW_CALL_LIMIT_S:
                rows.append((name, size, "skipped", f"one call predicted {predicted:.0f} s > 30 s"))
                out[f"{key}_skipped"] = [*out.get(f"{key}_skipped", []), size]
                continue
            call = build(histories[size])
            ms, reps = _timed_calls(call)
            measured[size] = ms
            rows.append((name, size, f"{ms:.3f}", f"{reps} reps"))
            out[f"{key}_median_ms_{size}"] = round(ms, 3)
        if len(measured) >= 2:
            lo, hi = min(measured), max(measured)
            out[f"{key}_ratio_{hi}_over_{lo}"] = round(measured[hi] / measured[lo], 1)
    return rows


# -- main -----------------------------------------------------------------------------


async def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--no-frameworks", action="store_true", help="skip LangChain/LlamaIndex")
    parser.add_argument("--tools-only", action="store_true", help="only the tool-heavy agent histories")
    args = parser.parse_args(argv)
    reps = 300 if args.quick else 3000
    path_reps = 100 if args.quick else 1000

    counter = counter_for_model("gpt-4o")
    if args.tools_only:
        tools_out: dict[str, Any] = {}
        for what, n, shown, note in await agent_rows(counter, reps, tools_out):
            print(f"{what:48} {n:>8,} {shown:>10}  {note}")
        print(json.dumps({**tools_out, "counter": counter.name, "python": sys.version.split()[0]}))
        return
    rng = random.Random(42)
    t0 = time.perf_counter()
    raw = make_turns(max(SIZES), rng)
    counted = count_once(raw, counter)
    histories = {n: counted[:n] for n in SIZES}
    setup_s = time.perf_counter() - t0

    rows: list[tuple[str, int, str, str]] = []
    out: dict[str, Any] = {}
    medians: dict[tuple[str, int], float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in SIZES:
            memory = MemoryStore()
            await fill(memory, histories[n], counter)
            sqlite = SQLiteStore(Path(tmp) / f"bench-{n}.db")
            await fill(sqlite, histories[n], counter)
            for strategy in ("sliding_summary", "hybrid"):
                state = await load_state(memory, strategy)
                ms = time_assemble(state, counter, strategy, reps)
                medians[("assemble " + strategy, n)] = ms
                rows.append((f"assemble() {strategy}", n, f"{ms:.3f}",
                             f"tail {len(state.turns)} turns, {len(state.key_moments)} key moments"))
            for label, store in (("MemoryStore", memory), ("SQLiteStore", sqlite)):
                for strategy in ("sliding_summary", "hybrid"):
                    ms = await time_whole_path(store, counter, strategy, path_reps)
                    medians[(f"{label} {strategy}", n)] = ms
                    rows.append((f"{label}.load() + assemble() {strategy}", n, f"{ms:.3f}", ""))
            await sqlite.close()

    rows += await agent_rows(counter, reps, out)
    if not args.no_frameworks:
        fw_sizes = {n: histories[100_000][:n] for n in (100, 1_000, 10_000, 100_000)}
        rows += framework_rows(fw_sizes, counter, out)

    small, big = SIZES
    print(f"setup: {max(SIZES):,} turns generated and counted once with {counter.name} "
          f"in {setup_s:.1f} s; input budget {Budget().input_tokens} tokens; "
          f"{reps} assemble() calls and {path_reps} load+assemble calls per row")
    print(f"{'what':48} {'turns':>8} {'median ms':>10}  note")
    for what, n, shown, note in rows:
        print(f"{what:48} {n:>8,} {shown:>10}  {note}")
    print()
    print(f"{'ratio 100,000 / 100':48} {'':>8} {'':>10}")
    for key in dict.fromkeys(k for k, _ in medians):
        ratio = medians[(key, big)] / medians[(key, small)]
        print(f"  {key:46} {ratio:>19.2f}")
        out[f"ratio_{key.replace(' ', '_').replace('.', '')}"] = round(ratio, 3)

    result = {
        "median_ms_100": round(medians[("assemble sliding_summary", small)], 4),
        "median_ms_100000": round(medians[("assemble sliding_summary", big)], 4),
        "ratio": round(medians[("assemble sliding_summary", big)]
                       / medians[("assemble sliding_summary", small)], 3),
        "hybrid_median_ms_100": round(medians[("assemble hybrid", small)], 4),
        "hybrid_median_ms_100000": round(medians[("assemble hybrid", big)], 4),
        "hybrid_ratio": round(medians[("assemble hybrid", big)] / medians[("assemble hybrid", small)], 3),
        **{f"path_{k.split()[0]}_{k.split()[1]}_ms_{n}": round(v, 4)
           for (k, n), v in medians.items() if not k.startswith("assemble")},
        **out,
        "counter": counter.name,
        "python": sys.version.split()[0],
    }
    print(json.dumps(result, ensure_ascii=False))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
