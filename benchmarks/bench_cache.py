"""How much of each turn's request a prompt cache can reuse, and what a turn costs.

Run: ``python benchmarks/bench_cache.py --locomo ../shared/data/locomo/locomo_dev.json
--chinese ../shared/data/cped/valid_split.csv`` (``--conversations N`` / ``--turns N`` to
replay less; ``--locomo-eval`` to add the LoCoMo evidence recall at 2,000 tokens of both
layouts, which takes a while).

Long conversations are replayed through the real entry point, `Engine.turn`, with the shipped
`EngineSettings` (8,192-token window), offline processors, the background jobs run after each
turn (summary, pins), and a model that answers with the conversation's own next turn:

- LoCoMo dev (English, 300–700 turns each, dated sessions): ``speaker_a`` is the user;
- a long Chinese conversation: one TV series of CPED (its first ``--turns`` utterances), its most
  frequent speaker the user, the others the assistant.

Each user turn answered by the other side is one request. For each request, rendered as the model
receives it (`contextmode.models.caching.request_text`), we measure the share of its tokens
that is a byte-identical prefix of the previous request of the session (what OpenAI, Anthropic,
DeepSeek, Qwen and the llama.cpp server can serve from their cache), and the money it costs at
the listed prices (`contextmode.pricing.DEFAULT_PRICES`: the cacheable prefix billed at the
cache price when it reaches the family's minimum; the rest at the cache-write price, i.e. a
cache written on every request), reply tokens not included.

Two layouts are replayed: ``shipped``, the shipped `EngineSettings` as they are (the ``default``
strategy, whose window slides a turn at a time, in the ``default`` order: recall and the rewrite
hint inside the system message, before the turns); ``cache_first``, the prompt-cache preset
(``CONTEXTMODE_STRATEGY=steady CONTEXTMODE_ORDER=cache_first``: instructions, reply format, pins,
summary and the window first, what changes every turn in one message after the window; the window
drops a block of its oldest turns at once). ``--locomo-eval`` adds LoCoMo evidence recall at 2,000
tokens of both, each recorded with its own background jobs (``locomo_recall_2000_delta``: the
preset minus the shipped default). The last line is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from contextmode.api import build_engine
from contextmode.engine import TurnRequest
from contextmode.evaluation.locomo import EvalOptions, evaluate_locomo, load_locomo
from contextmode.models.caching import cacheable_prefix_tokens, request_text
from contextmode.pricing import DEFAULT_PRICES, turn_cost
from contextmode.settings import EngineSettings
from contextmode.store.memory import MemoryStore
from contextmode.testing import FunctionModel
from contextmode.tokens import TokenCounter, counter_for_encoding
from contextmode.types import SessionKey

Role = Literal["user", "assistant"]


@dataclass(frozen=True)
class Line:
    role: Role
    text: str
    speaker: str
    at: datetime | None = None


@dataclass(frozen=True)
class Layout:
    name: str
    order: str
    strategy: str


_SHIPPED = EngineSettings()
PRESET = Layout("cache_first", "cache_first", "steady")
"""The prompt-cache preset (docs/caching.md): not shipped, it keeps less evidence from 4,000 tokens up."""
LAYOUTS = (Layout("shipped", _SHIPPED.order, _SHIPPED.strategy), PRESET)


@dataclass
class Replay:
    shares: list[float] = field(default_factory=list)
    prompt: list[int] = field(default_factory=list)
    cached: list[int] = field(default_factory=list)
    by_conversation: dict[str, float] = field(default_factory=dict)


def locomo_lines(path: Path, limit: int, turns: int) -> list[tuple[str, list[Line]]]:
    out = []
    for conv in load_locomo(path)[:limit]:
        lines = [Line("user" if t.speaker == conv.speaker_a else "assistant", t.text, t.speaker, t.at)
                 for t in conv.turns[:turns]]
        out.append((conv.sample_id, lines))
    return out


def cped_lines(path: Path, turns: int) -> tuple[str, list[Line]]:
    with path.open(encoding="utf-8-sig") as f:
        rows = list(csv.DictReader(f))
    series = Counter(r["TV_ID"] for r in rows).most_common(1)[0][0]
    rows = [r for r in rows if r["TV_ID"] == series][:turns]
    user = Counter(r["Speaker"] for r in rows).most_common(1)[0][0]
    return f"cped-tv{series}", [Line("user" if r["Speaker"] == user else "assistant", r["Utterance"], r["Speaker"])
                                for r in rows]


async def replay(lines: Sequence[Line], layout: Layout, counter: TokenCounter, out: Replay, label: str) -> None:
    answer = {"text": ""}
    model = FunctionModel(lambda _messages: answer["text"], name="function-model")
    engine = build_engine(store=MemoryStore(), model=model, counter=counter,
                          settings=replace(EngineSettings(), order=layout.order, strategy=layout.strategy))
    previous: str | None = None
    shares: list[float] = []
    try:
        i = 0
        while i < len(lines):
            line = lines[i]
            nxt = lines[i + 1] if i + 1 < len(lines) else None
            if line.role == "user" and nxt is not None and nxt.role == "assistant":
                answer["text"] = nxt.text
                request = TurnRequest(key=SessionKey("bench", label), message=line.text, now=line.at,
                                      metadata={"speaker": line.speaker})
                result = await engine.turn(request)
                text = request_text(list(result.prepared.messages))
                prompt = counter.count(text)
                cached = cacheable_prefix_tokens(previous, text, counter)
                previous = text
                out.prompt.append(prompt)
                out.cached.append(cached)
                shares.append(cached / prompt)
                i += 2
            else:
                await engine.record("bench", label, line.role, line.text, created_at=line.at,
                                    metadata={"speaker": line.speaker})
                i += 1
            await engine.drain()
    finally:
        await engine.close()
    out.shares.extend(shares)
    out.by_conversation[label] = round(statistics.median(shares), 4) if shares else 0.0


def dollars_per_1000(data: Replay) -> dict[str, float]:
    out = {}
    for price in DEFAULT_PRICES:
        total = sum(turn_cost(price, prompt_tokens=p, cached_tokens=c).usd for p, c in zip(data.prompt, data.cached,
                                                                                          strict=True))
        out[price.family] = round(1000 * total / max(1, len(data.prompt)), 4)
    return out


def summary(data: Replay) -> dict[str, Any]:
    q = statistics.quantiles(data.shares, n=10) if len(data.shares) > 1 else [0.0] * 9
    return {
        "turns": len(data.shares),
        "share_p50": round(statistics.median(data.shares), 4) if data.shares else 0.0,
        "share_p10": round(q[0], 4),
        "share_mean": round(statistics.fmean(data.shares), 4) if data.shares else 0.0,
        "prompt_tokens_mean": round(statistics.fmean(data.prompt), 1) if data.prompt else 0.0,
        "by_conversation": data.by_conversation,
        "usd_per_1000_turns": dollars_per_1000(data),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--locomo", type=Path, required=True)
    parser.add_argument("--chinese", type=Path, required=True, help="CPED valid_split.csv")
    parser.add_argument("--conversations", type=int, default=5, help="LoCoMo conversations to replay")
    parser.add_argument("--turns", type=int, default=800, help="turns per conversation at most")
    parser.add_argument("--locomo-eval", action="store_true",
                        help="also LoCoMo evidence recall at 2,000 tokens, shipped and the preset")
    args = parser.parse_args(argv)
    counter = counter_for_encoding("cl100k_base")
    convs = [*locomo_lines(args.locomo, args.conversations, args.turns), cped_lines(args.chinese, args.turns)]
    results: dict[str, dict[str, Any]] = {}
    for layout in LAYOUTS:
        data, zh = Replay(), Replay()
        started = time.perf_counter()
        for label, lines in convs:
            target = zh if label.startswith("cped") else data
            asyncio.run(replay(lines, layout, counter, target, label))
            print(f"[bench_cache] {layout.name} {label}: p50 {target.by_conversation[label]:.3f}", file=sys.stderr)
        both = Replay(shares=data.shares + zh.shares, prompt=data.prompt + zh.prompt, cached=data.cached + zh.cached,
                      by_conversation={**data.by_conversation, **zh.by_conversation})
        results[layout.name] = {"all": summary(both), "locomo": summary(data), "chinese": summary(zh),
                                "seconds": round(time.perf_counter() - started, 1)}
    delta = None
    if args.locomo_eval:
        shipped = evaluate_locomo(args.locomo, [2000], [_SHIPPED.strategy], progress=False)["recall"]
        preset = evaluate_locomo(args.locomo, [2000], [PRESET.strategy], progress=False,
                                 options=EvalOptions(recorded_strategy=PRESET.strategy, order=PRESET.order))["recall"]
        results["locomo_recall_2000"] = {"shipped": shipped[_SHIPPED.strategy]["2000"],
                                         PRESET.name: preset[PRESET.strategy]["2000"]}
        delta = round(preset[PRESET.strategy]["2000"] - shipped[_SHIPPED.strategy]["2000"], 4)
    for name in ("shipped", PRESET.name):
        r = results[name]["all"]
        print(f"{name}: {r['turns']} turns, cacheable prefix share p50 {r['share_p50']:.3f} "
              f"(p10 {r['share_p10']:.3f}), $/1000 turns {r['usd_per_1000_turns']}")
    line = {
        "entry": "Engine.turn, shipped EngineSettings (8,192-token window), offline processors, cl100k",
        "shipped": {"order": _SHIPPED.order, "strategy": _SHIPPED.strategy},
        "cache_first_preset": {"order": PRESET.order, "strategy": PRESET.strategy},
        "prices": {p.family: {"input": p.input, "cache_read": p.cache_read, "cache_write": p.cache_write,
                              "min_prefix": p.min_prefix} for p in DEFAULT_PRICES},
        "detail": results,
        "cacheable_prefix_share_p50": results["shipped"]["all"]["share_p50"],
        "cacheable_prefix_share_p50_cache_first": results[PRESET.name]["all"]["share_p50"],
        "usd_per_1000_turns": results["shipped"]["all"]["usd_per_1000_turns"],
        "usd_per_1000_turns_cache_first": results[PRESET.name]["all"]["usd_per_1000_turns"],
        "locomo_recall_2000_delta": delta,
    }
    from contextmode.evaluation.report import print_json_line

    print_json_line(line)


if __name__ == "__main__":
    main()
