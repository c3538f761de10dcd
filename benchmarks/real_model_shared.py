"""Replies and background work sharing one real local model: interleaved sessions, processors
off and on.

Run: ``python benchmarks/real_model_shared.py`` (needs the ``local-model`` extra; ``--turns 4``
for a quicker look, ``--rounds 2`` to alternate the two runs twice on a loaded machine;
``--table`` for a short plan instead: an English session of 5 turns, then a Chinese one of 3,
reply time per turn and pending work at each turn's start). The last line printed is a JSON
object; it holds the load averages (1, 5, 15 min) at start and end: on a shared machine the
figures move with them.

One llama-cpp-python server (SmolLM2-135M-Instruct, ``--n_ctx 4096``, one request at a time)
answers the replies and the processors' calls. The engine is ``build_engine()`` with the
shipped defaults (memory store), run twice over the same three interleaved sessions (two
Chinese, one English: turn 1 of each, then turn 2 of each…), each turn sent once the previous
reply ended, without waiting for background work (as ``contextmode serve`` does):

- ``offline``: ``CONTEXTMODE_PROCESSORS=offline`` (the reply on the local model, memory's
  processors without it);
- ``llm``: ``CONTEXTMODE_PROCESSORS=llm`` (memory's processors on the same server).

Printed: reply latency (``Engine.stream`` from the call to ``done``) p50/p95 and time to first
token per run; turn by turn the two runs side by side (a turn's *twin* is the same turn of the
``offline`` run) with the background work pending when it started; the total reply time ratio
(goal ≤ 1.5), the worst turn/twin ratio (goal ≤ 3); the background work pending per session
at each turn's start and sampled every 0.25 s (``pending``: units of work, the session's jobs
running or waiting in the job runner, `JobRunner.units`: one job is one unit whatever turns and
kinds of work it covers; a finished job whose outcome is being written is not counted; goal ≤ 1
unit per session at any moment); the time to drain after the last turn
(goal ≤ 30 s); each run's model calls by step (reply or background: count, time, wait for a
slot, outcomes) from the event loop's call log (`models.calls`, what the turns' traces show), and
the background jobs' outcomes with their last errors. Each turn also has its time to
``Prepared`` (``prep``: loading, detection, rewriting, assembly and storing the user turn:
memory's part before the reply is asked for); ``worst_turn_memory_only_ratio`` is the worst turn
counting only what memory added (its ``prep`` beyond its twin's) on top of its twin, so a ratio
can be told apart from a small model's reply that ran longer in one run than in the other. Each
turn's progress line (and its row in the JSON, ``calls``) lists the model calls that overlapped
it: the step (``bg`` and the session for a background job's), when it asked (seconds from the
turn's start), its wait for a slot, its time, tokens out and outcome; and what the response path
decided: who gave the detection verdict (the model or the offline detector) and what became of
a rewrite (verified, refused by the verifier, none), counted per run in ``response_path``.

The benchmark also runs on earlier code, for a *before* figure on the same machine:
``PYTHONPATH=<checkout>/src python benchmarks/real_model_shared.py --table --label before`` (an
engine without the call log lists no calls).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from contextmode.testing.local_model import CONVERSATIONS, LOCAL_MODEL_ALIAS, llama_server
from contextmode.types import SessionKey

SECOND_CHINESE: tuple[str, ...] = (
    "我对海鲜过敏，预算两百以内。",
    "推荐一家杭州的餐厅。",
    "它在哪？",
    "晚上几点关门？",
    "我们六个人，需要包间吗？",
    "有没有素菜？我朋友吃素。",
    "人均大概多少钱？",
    "停车方便吗？",
    "那附近还有别的选择吗？",
    "好的，就订这家吧。",
)
"""A second Chinese session (the first turns are the issue's own)."""

SESSIONS: dict[str, tuple[str, ...]] = {
    "zh-a": CONVERSATIONS["zh"],
    "zh-b": SECOND_CHINESE,
    "en": CONVERSATIONS["en"],
}


def _p(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


Plan = list[tuple[str, int, str]]
"""``(session, turn number, message)`` in the order sent."""


def interleaved(turns: int) -> Plan:
    """The three sessions interleaved: turn 1 of each, then turn 2 of each…"""
    return [(session, i + 1, messages[i]) for i in range(turns) for session, messages in SESSIONS.items()]


def issue_table() -> Plan:
    """An English session of 5 turns, then a Chinese one of 3."""
    return ([("en", i + 1, m) for i, m in enumerate(CONVERSATIONS["en"][:5])]
            + [("zh-b", i + 1, m) for i, m in enumerate(SECOND_CHINESE[:3])])


def _pending_units(engine: Any, session: str) -> int:
    """Units of background work the session has not done yet: its jobs running or waiting in the
    engine's job runner (`JobRunner.units`; one job, whatever it covers, is one unit). A finished
    job whose outcome is still being written is not counted (`JobRunner.pending` lists it too)."""
    units = getattr(engine.jobs, "units", None)
    if units is not None:
        return int(units("local", session))
    return len(engine.jobs.pending("local", session))  # a runner without `units`: jobs it lists


async def _sample(engine: Any, sessions: Sequence[str], samples: list[tuple[float, dict[str, int]]],
                  started: float) -> None:
    while True:
        samples.append((round(time.perf_counter() - started, 2),
                        {s: _pending_units(engine, s) for s in sessions}))
        await asyncio.sleep(0.25)


async def _one_turn(engine: Any, session: str, message: str) -> dict[str, Any]:
    from contextmode.engine import TurnRequest
    from contextmode.types import SessionKey

    since = time.monotonic()
    started = time.perf_counter()
    ttft: float | None = None
    prepared_s: float | None = None
    decided: dict[str, str] = {}
    answer, outcome, partial = "", "answered", False
    try:
        async for event in engine.stream(TurnRequest(key=SessionKey("local", session), message=message)):
            if event.kind == "prepared":
                prepared_s = time.perf_counter() - started  # memory's part: load, detect, rewrite, assemble
                decided = _decided(event.prepared)
            elif event.kind == "delta" and ttft is None:
                ttft = time.perf_counter() - started
            elif event.kind == "done":
                answer, partial = event.result.answer, event.result.partial
            elif event.kind == "failed":
                answer, outcome = event.partial_answer, f"failed: {type(event.error).__name__}"
    except Exception as exc:  # a bug, not a model failure: counted, the run goes on
        outcome = f"error: {type(exc).__name__}: {exc}"[:120]
    return {"seconds": time.perf_counter() - started, "ttft_s": ttft, "prepared_s": prepared_s, "chars": len(answer),
            "partial": partial, "outcome": outcome if answer.strip() or outcome != "answered" else "empty",
            "calls": [_call_line(c) for c in _calls_since(since)], **decided}


def _decided(prepared: Any) -> dict[str, str]:
    """What the response path decided for a turn: who gave the detection verdict (``llm``: the
    model; ``offline``: the offline detector, sure, standing in for the model, or alone) and what
    became of a rewrite (``llm verified``, ``offline verified``, ``llm rejected``…, ``none``)."""
    detection = prepared.detection
    reason = str(getattr(detection, "reason", ""))
    who = "llm" if re.match(r"\w+@\w+: (yes|no)", reason) else "offline"  # `LLMContextDetector`'s own verdict
    rewrite, rejected = prepared.rewrite, getattr(prepared, "rejected_rewrite", None)
    if rewrite is not None and rewrite.changed:
        what = f"{rewrite.source or '?'} {'verified' if rewrite.verified else 'unverified'}"
    elif rejected is not None:
        what = f"{rejected.source or '?'} rejected"
    else:
        what = "none"
    return {"detected_by": who, "verdict": "needs context" if detection.needs_context else "standalone",
            "rewrite": what}


def _calls_since(since: float) -> Sequence[Any]:
    """The model calls that overlapped ``[since, now]`` (`models.calls.CallLog.between`); none
    from an engine older than the call log (a *before* run on earlier code)."""
    try:
        from contextmode.models.calls import call_log
    except ImportError:
        return ()
    return call_log().between(since)


def _call_line(call: Any) -> str:
    """One model call that overlapped a turn, in a line: step (``bg`` for a background job's),
    when it asked (s from the turn's start), its wait for a slot, its time, tokens out, outcome."""
    where = "" if call.priority == "reply" else f"bg {call.session} "
    return (f"{where}{call.step} at {call.start_ms / 1000:.1f} wait {call.wait_ms / 1000:.1f} "
            f"took {call.duration_ms / 1000:.1f} out {call.completion_tokens or 0} {call.outcome.split(':')[0]}")


async def run_mode(base_url: str, processors: str, plan: Plan) -> dict[str, Any]:
    os.environ.update({"CONTEXTMODE_PROCESSORS": processors, "CONTEXTMODE_LLM_BASE_URL": base_url,
                       "CONTEXTMODE_LLM_MODEL": LOCAL_MODEL_ALIAS})
    from contextmode.api import build_engine

    engine = build_engine(store="memory://")
    info = engine.model.server_info() if hasattr(engine.model, "server_info") else None
    endpoint = {"kind": getattr(info, "kind", None), "slots": getattr(info, "slots", None),
                "window": getattr(info, "context_window", None)}  # what the start-up probe found
    started = time.perf_counter()
    since = time.monotonic()
    samples: list[tuple[float, dict[str, int]]] = []
    sessions = list(dict.fromkeys(session for session, _, _ in plan))
    sampler = asyncio.get_running_loop().create_task(_sample(engine, sessions, samples, started))
    rows: list[dict[str, Any]] = []
    for session, turn, message in plan:
        pending = {s: _pending_units(engine, s) for s in sessions}
        row = await _one_turn(engine, session, message)
        row.update(session=session, turn=turn, pending_at_start=pending[session],
                   pending_all_at_start=sum(pending.values()), at_s=round(time.perf_counter() - started, 1))
        rows.append(row)
        print(f"[{processors} {session} {turn}] {row['seconds']:.1f} s (ttft {row['ttft_s'] or 0:.1f} s) "
              f"{row['outcome']}, {row['chars']} chars, pending here {row['pending_at_start']} "
              f"/ all {row['pending_all_at_start']}, load {os.getloadavg()[0]:.1f}; prep {row['prepared_s'] or 0:.1f} s; "
              f"detected by {row.get('detected_by', '?')} ({row.get('verdict', '?')}), rewrite {row.get('rewrite', '?')}; "
              f"calls: {'; '.join(row['calls']) or 'none'}", file=sys.stderr, flush=True)
    last_turn = time.perf_counter()
    await engine.drain()
    drain_s = time.perf_counter() - last_turn
    sampler.cancel()
    jobs: dict[str, dict[str, int]] = defaultdict(lambda: {"ok": 0, "rejected": 0, "failed": 0})
    errors: dict[str, str] = {}
    calls = [{"step": c.step, "priority": c.priority, "wait_s": c.wait_ms / 1000, "seconds": c.duration_ms / 1000,
              "tokens_out": c.completion_tokens, "outcome": c.outcome.split(":")[0]}
             for c in _calls_since(since)]  # every call of the run (a trace shows a turn's)
    for session in sessions:
        try:
            info = await engine.store.info(SessionKey("local", session))
        except TypeError:  # earlier code (a *before* run): the store took the tenant and the id
            info = await engine.store.info("local", session)
        for name, stats in (info.jobs.items() if info is not None else ()):
            for outcome in ("ok", "rejected", "failed"):
                jobs[name][outcome] += getattr(stats, outcome)
            if stats.last_error:
                errors[f"{session} {name}"] = stats.last_error[:160]
    await engine.close()
    peak = {s: max([p[s] for _, p in samples] + [r["pending_at_start"] for r in rows if r["session"] == s])
            for s in sessions}
    seconds = [r["seconds"] for r in rows]
    ttfts = [r["ttft_s"] for r in rows if r["ttft_s"] is not None]
    by_step: dict[str, dict[str, Any]] = defaultdict(lambda: {"calls": 0, "seconds": 0.0, "wait_s": 0.0,
                                                             "outcomes": defaultdict(int)})
    for call in calls:
        step = by_step[f"{call['priority']}:{call['step']}"]
        step["calls"] += 1
        step["seconds"] = round(step["seconds"] + call["seconds"], 1)
        step["wait_s"] = round(step["wait_s"] + call["wait_s"], 1)
        step["outcomes"][call["outcome"]] += 1
    return {
        "processors": processors,
        "endpoint": endpoint,
        "rows": rows,
        "total_s": round(sum(seconds), 1),
        "p50_s": round(_p(seconds, 0.5), 2),
        "p95_s": round(_p(seconds, 0.95), 2),
        "ttft_p50_s": round(_p(ttfts, 0.5), 2),
        "ttft_p95_s": round(_p(ttfts, 0.95), 2),
        "drain_s": round(drain_s, 1),
        "pending_peak": peak,
        "pending_timeline": _compress(samples),
        "jobs": dict(jobs),
        "job_errors": errors,
        "model_calls": {k: {**v, "outcomes": dict(v["outcomes"])} for k, v in by_step.items()},
        "response_path": {  # what the response path's calls bought: who decided, which rewrites stood
            "detected_by": dict(Counter(r.get("detected_by", "?") for r in rows)),
            "rewrites": dict(Counter(r.get("rewrite", "?") for r in rows)),
        },
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _compress(samples: list[tuple[float, dict[str, int]]]) -> list[list[Any]]:
    """The samples where a session's pending count changed: ``[t, {session: n}]``."""
    out: list[list[Any]] = []
    last: dict[str, int] | None = None
    for t, counts in samples:
        if counts != last:
            out.append([t, counts])
            last = counts
    return out


def compare(offline: dict[str, Any], llm: dict[str, Any]) -> dict[str, Any]:
    twins = {(r["session"], r["turn"]): r["seconds"] for r in offline["rows"]}
    ratios = [(r["seconds"] / twins[(r["session"], r["turn"])], r["session"], r["turn"])
              for r in llm["rows"] if twins.get((r["session"], r["turn"]))]
    worst = max(ratios, default=(0.0, "-", 0))
    # Memory's own part of a turn: the time to `Prepared` (load, detection, rewriting, assembly)
    # beyond its twin's, against the twin's whole turn; the rest of a ratio is the reply itself
    # (a small model's reply length varies with its context).
    prepared = {(r["session"], r["turn"]): r.get("prepared_s") or 0.0 for r in offline["rows"]}
    added = [((r.get("prepared_s") or 0.0) - prepared.get((r["session"], r["turn"]), 0.0), r["session"], r["turn"])
             for r in llm["rows"] if twins.get((r["session"], r["turn"]))]
    worst_added = max(((a / twins[(s, t)], s, t) for a, s, t in added), default=(0.0, "-", 0))
    return {
        "memory_added_s_total": round(sum(a for a, _, _ in added), 1),
        "worst_turn_memory_only_ratio": round(1 + worst_added[0], 2),
        "worst_turn_memory_only": f"{worst_added[1]} {worst_added[2]}",
        "total_ratio": round(llm["total_s"] / offline["total_s"], 2) if offline["total_s"] else None,
        "worst_turn_ratio": round(worst[0], 2),
        "worst_turn": f"{worst[1]} {worst[2]}",
        "turns_over_3x": sum(r > 3 for r, _, _ in ratios),
        "pending_peak_per_session": max(llm["pending_peak"].values(), default=0),
        "drain_s": llm["drain_s"],
    }


def _print(runs: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    offline, llm = runs[-2], runs[-1]
    print(f"{'turn':<9} {'llm s':>7} {'ttft':>5} {'prep':>5} {'offline s':>9} {'ttft':>5} {'prep':>5} {'ratio':>6} "
          f"{'pending llm':>11} {'offline':>7}")
    twins = {(r["session"], r["turn"]): r for r in offline["rows"]}
    for r in llm["rows"]:
        twin = twins.get((r["session"], r["turn"]))
        ratio = r["seconds"] / twin["seconds"] if twin and twin["seconds"] else float("nan")
        print(f"{r['session'] + ' ' + str(r['turn']):<9} {r['seconds']:>7.1f} {r['ttft_s'] or 0:>5.1f} "
              f"{r.get('prepared_s') or 0:>5.1f} {twin['seconds'] if twin else 0:>9.1f} "
              f"{(twin or {}).get('ttft_s') or 0:>5.1f} {(twin or {}).get('prepared_s') or 0:>5.1f} {ratio:>6.2f} "
              f"{r['pending_at_start']:>11} {(twin or {}).get('pending_at_start', 0):>7}")
    print("pending units per session over time (llm run; where a count changed):")
    for t, counts in llm["pending_timeline"][:60]:
        print(f"  {t:>7.2f} s  " + "  ".join(f"{k} {v}" for k, v in counts.items()))
    for run in runs:
        print(f"{run['processors']:<8} total {run['total_s']} s, p50 {run['p50_s']} s, p95 {run['p95_s']} s, "
              f"ttft p50 {run['ttft_p50_s']} s p95 {run['ttft_p95_s']} s, drain {run['drain_s']} s, "
              f"pending peak {run['pending_peak']}, jobs {run['jobs']}, response path {run['response_path']}")
    print(f"memory's part (time to Prepared beyond the twin's): {summary['memory_added_s_total']} s in all; "
          f"worst turn counting only it {summary['worst_turn_memory_only']} {summary['worst_turn_memory_only_ratio']}x")
    print(f"total ratio {summary['total_ratio']} (goal <= 1.5), worst turn {summary['worst_turn']} "
          f"{summary['worst_turn_ratio']}x (goal <= 3), pending peak per session "
          f"{summary['pending_peak_per_session']} (goal <= 1), drain {summary['drain_s']} s (goal <= 30)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=10, help="turns per session (max 10)")
    parser.add_argument("--rounds", type=int, default=1, help="offline/llm runs, alternated")
    parser.add_argument("--label", default="", help="a name for this run in the JSON (before/after)")
    parser.add_argument("--threads", type=int, default=None,
                        help="llama server threads, generation and prompts (default: the server's)")
    parser.add_argument("--reply-max-tokens", type=int, default=None,
                        help="eval only: CONTEXTMODE_LLM_REPLY_MAX_TOKENS for both runs (default: the shipped 1024)")
    parser.add_argument("--table", action="store_true",
                        help="instead: an English session of 5 turns, then a Chinese one of 3")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the llama server on the way out
    os.environ.setdefault("CONTEXTMODE_HOME", tempfile.mkdtemp(prefix="contextmode-bench-"))
    turns = max(1, min(args.turns, 10))
    runs: list[dict[str, Any]] = []
    summaries = []
    if args.reply_max_tokens:
        os.environ["CONTEXTMODE_LLM_REPLY_MAX_TOKENS"] = str(args.reply_max_tokens)
    plan = issue_table() if args.table else interleaved(turns)
    load_before = os.getloadavg()
    threads = {"threads": args.threads} if args.threads else {}  # earlier code (a *before* run) has no such option
    with llama_server(Path(tempfile.mkdtemp(prefix="contextmode-real-model-")), **threads) as base_url:
        for _ in range(max(1, args.rounds)):
            for processors in ("offline", "llm"):
                runs.append(asyncio.run(run_mode(base_url, processors, plan)))
            summaries.append(compare(runs[-2], runs[-1]))
    summary = summaries[-1]
    _print(runs, summary)
    result = {
        "label": args.label,
        "model": "SmolLM2-135M-Instruct Q4_1, llama-cpp-python server (one slot), n_ctx 4096",
        "server_threads": args.threads,
        "reply_max_tokens": args.reply_max_tokens or "shipped default",
        "plan": "issue table (en 5 turns, then zh 3)" if args.table else "interleaved",
        "sessions": list(dict.fromkeys(s for s, _, _ in plan)), "turns_per_session": None if args.table else turns,
        "rounds": len(summaries),
        "pending_counts": "units: the session's jobs running or waiting in the job runner (JobRunner.units)",
        "load_at_start": [round(x, 2) for x in load_before],
        "load_at_end": [round(x, 2) for x in os.getloadavg()],
        "summary": summary,
        "rounds_summary": summaries,
        "runs": [{k: v for k, v in run.items() if k not in ("rows", "pending_timeline")} for run in runs],
        "turns": [{"session": r["session"], "turn": r["turn"], "llm_s": round(r["seconds"], 1),
                   "offline_s": round(t["seconds"], 1), "llm_ttft_s": _round(r["ttft_s"]),
                   "offline_ttft_s": _round(t["ttft_s"]), "llm_prepared_s": _round(r["prepared_s"]),
                   "offline_prepared_s": _round(t["prepared_s"]), "pending": r["pending_at_start"]}
                  for r, t in zip(runs[-1]["rows"], runs[-2]["rows"], strict=True)],
        "pending_timeline_llm": runs[-1]["pending_timeline"][:200],
        "median_total_ratio": round(statistics.median(s["total_ratio"] or 0 for s in summaries), 2),
    }
    print(json.dumps(result, ensure_ascii=False))


if __name__ == "__main__":
    main()
