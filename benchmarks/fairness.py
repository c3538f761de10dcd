"""Fairness: does one client's traffic stall everyone else's ``/healthz``?

Run: ``python benchmarks/fairness.py`` (``--streams``, ``--deltas``, ``--hostile-clients``,
``--hostile-keys``, ``--rounds``). The last line printed is a JSON object.

On loopback only, the script starts the stub model server (OpenAI protocol, one
character per delta) and one service worker as shipped (uvicorn on
``contextmode.testing.worker:create_worker_app``, i.e. `create_app` around
``build_engine()``, a SQLite store in a temp folder, API keys on). A prober (a process
of its own, so the load generator cannot delay it) sends ``GET /healthz`` every 10 ms
while each scenario runs; its p99 is reported:

- ``healthz_p99_ms_streams``: ``--streams`` (20) concurrent streamed turns, each
  answered with ``--deltas`` (5,000) one-character deltas by the stub model;
- ``healthz_p99_ms_hostile_body``: ``--hostile-clients`` (4) clients each sending
  bodies of ``--hostile-keys`` (1,000,000) unknown keys (about 19 MB) for
  ``--hostile-seconds`` (8) or ``--rounds`` (200) bodies each, whichever comes first,
  once without an API key and once with a valid one (the worse of the two runs);
- ``healthz_p99_ms_tool_results``: ``--tool-clients`` (2) clients each sending OpenAI
  proxy requests holding one ``--tool-result-mb`` (9.6 MB) tool result, for
  ``--hostile-seconds`` or ``--rounds`` requests each (refused with 40002 above
  ``CONTEXTMODE_MAX_TOOL_RESULT_CHARS``: what it costs to read, parse and check them);
- ``idle``: the same probe with nothing else running (what the machine itself costs);
- ``max_error_bytes``: the largest error response seen for those bodies and for a
  set of malformed requests (unknown keys, wrong types, invalid JSON, bad proxy messages).

``--only tool_results`` runs the idle probe and that scenario alone.

Targets: every p99 ≤ 100 ms, ``max_error_bytes`` ≤ 4,096. Every loop is bounded (a fixed
number of streams and rounds) and every scenario has a time limit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from contextmode.testing.worker import Cluster

KEY = "fairness-bench-key"
TARGETS = {"healthz_p99_ms_streams": 100.0, "healthz_p99_ms_hostile_body": 100.0,
           "healthz_p99_ms_tool_results": 100.0, "max_error_bytes": 4096}


def p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else float("nan")


def _probe(url: str, interval_s: float, ready: Any, stop: Any, out: Any) -> None:
    """In a process of its own (the load generator's loop must not delay the probes)."""
    samples: list[float] = []
    failures = 0
    with httpx.Client(timeout=60) as client:
        try:
            client.get(f"{url}/healthz")  # connect once before measuring
        except httpx.HTTPError:
            failures += 1  # the service is already stalled: measure anyway
        ready.set()
        while not stop.is_set():
            started = time.perf_counter()
            try:
                failures += client.get(f"{url}/healthz").status_code != 200
            except httpx.HTTPError:
                failures += 1
            samples.append((time.perf_counter() - started) * 1000)
            time.sleep(interval_s)
    out.put((samples, failures))


@dataclass
class Probes:
    samples: list[float]
    failures: int


async def probed(url: str, work: Any, limit_s: float) -> tuple[Any, Probes]:
    """Run ``work`` while another process probes ``/healthz`` every 10 ms."""
    context = multiprocessing.get_context("spawn")
    ready, stop, out = context.Event(), context.Event(), context.Queue()
    prober = context.Process(target=_probe, args=(url, 0.01, ready, stop, out), daemon=True)
    prober.start()
    if not await asyncio.to_thread(ready.wait, 120):
        raise RuntimeError("the /healthz prober did not start")
    await asyncio.sleep(0.3)  # a few idle samples first
    try:
        result = await asyncio.wait_for(work, limit_s)
    finally:
        stop.set()
        samples, failures = await asyncio.to_thread(out.get, True, 60)
        await asyncio.to_thread(prober.join, 10)
    return result, Probes(samples=samples, failures=failures)


async def one_stream(client: httpx.AsyncClient, url: str, i: int, message: str) -> dict[str, int]:
    events = chars = 0
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"message": message, "stream": True}
    async with client.stream("POST", f"{url}/v1/sessions/fair-{i}/messages", json=body, headers=headers) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                event = json.loads(line[6:])
                if event.get("type") == "delta":
                    events += 1
                    chars += len(event["text"])
    return {"status": r.status_code, "delta_events": events, "chars": chars}


def log(message: str) -> None:
    print(f"[fairness] {message}", file=sys.stderr, flush=True)


async def streams_scenario(url: str, streams: int) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=streams + 2)) as client:
        work = asyncio.gather(*(one_stream(client, url, i, f"stream {i}: tell me a long story") for i in range(streams)))
        results, prober = await probed(url, work, limit_s=300)
    return {
        "healthz_p99_ms": round(p99(prober.samples), 1),
        "healthz_median_ms": round(statistics.median(prober.samples), 1),
        "probes": len(prober.samples),
        "probe_failures": prober.failures,
        "streams_ok": sum(1 for r in results if r["status"] == 200),
        "chars_per_stream": sorted({r["chars"] for r in results}),
        "delta_events_median": statistics.median(r["delta_events"] for r in results),
    }


@dataclass(frozen=True, kw_only=True)
class Load:
    """What one hostile client sends, where, and for how long."""

    body: bytes
    authed: bool
    rounds: int
    seconds: float
    path: str = "/v1/sessions/hostile/messages"


async def hostile_client(url: str, load: Load, sizes: list[int], outcomes: dict[str, int]) -> None:
    body, authed, rounds, seconds = load.body, load.authed, load.rounds, load.seconds
    headers = {"content-type": "application/json", "x-session-id": "hostile"}
    if authed:
        headers["Authorization"] = f"Bearer {KEY}"
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=120) as client:
        for _ in range(rounds):
            if time.monotonic() > deadline:
                break
            try:
                r = await client.post(f"{url}{load.path}", content=body, headers=headers)
            except httpx.HTTPError as exc:  # refused early: the server closed while we were still sending
                outcomes[type(exc).__name__] = outcomes.get(type(exc).__name__, 0) + 1
                continue
            outcomes[str(r.status_code)] = outcomes.get(str(r.status_code), 0) + 1
            sizes.append(len(r.content))


async def hostile_scenario(url: str, load: Load, clients: int) -> dict[str, Any]:
    sizes: list[int] = []
    outcomes: dict[str, int] = {}
    work = asyncio.gather(*(hostile_client(url, load, sizes, outcomes) for _ in range(clients)))
    _, prober = await probed(url, work, limit_s=600)
    return {
        "healthz_p99_ms": round(p99(prober.samples), 1),
        "healthz_max_ms": round(max(prober.samples, default=float("nan")), 1),
        "probes": len(prober.samples),
        "probe_failures": prober.failures,
        "outcomes": outcomes,
        "max_error_bytes": max(sizes, default=0),
    }


async def malformed_requests(url: str) -> list[int]:
    """Error sizes of malformed requests of several kinds (authenticated)."""
    headers = {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}
    many_unknown = json.dumps({"message": "hi", **{f"k{i}" * 20: i for i in range(5000)}})
    bodies = [
        many_unknown,
        json.dumps({"message": "hi", "images": list(range(15_000))}),
        json.dumps({"message": ["x" * 1000] * 5000}),
        '{"message": "unterminated',
        json.dumps({"message": "x" * 100_000}),
    ]
    proxy = json.dumps({"messages": [{"content": "x"}] * 5000, "user": "s"})
    sizes = []
    async with httpx.AsyncClient(timeout=60) as client:
        for body in bodies:
            r = await client.post(f"{url}/v1/sessions/bad/messages", content=body, headers=headers)
            sizes.append(len(r.content))
        r = await client.post(f"{url}/v1/chat/completions", content=proxy, headers=headers)
        sizes.append(len(r.content))
    return sizes


def _tool_body(megabytes: float) -> bytes:
    """An OpenAI proxy request whose last message is one tool result of ``megabytes`` MB."""
    result = "0123456789abcdef" * int(megabytes * 1_000_000 / 16)
    return json.dumps({"model": "m", "messages": [
        {"role": "user", "content": "read the log"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "read_log", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": result},
    ]}).encode()


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    hostile = json.dumps({"message": "hi", **{f"k{i}": i for i in range(args.hostile_keys)}}).encode()
    with tempfile.TemporaryDirectory(prefix="cm-fairness-") as tmp:
        cluster = Cluster(
            workers=1,
            store_url=f"sqlite:///{Path(tmp) / 'fair.db'}",
            log_dir=Path(tmp) / "logs",
            env={
                **({"PYTHONPATH": args.service_src} if args.service_src else {}),
                "CONTEXTMODE_API_KEYS": f"{KEY}:bench",
                "CONTEXTMODE_CONTEXT_WINDOW": "32768",
                "CONTEXTMODE_REPLY_RESERVE": str(args.deltas * 2),
            },
            stub_args=["--chunk-chars", "1", "--reply-chars", str(args.deltas)],
        )
        await asyncio.to_thread(cluster.start)
        try:
            url = cluster.urls[0]
            log("idle")
            _, idle = await probed(url, asyncio.sleep(5), limit_s=60)
            idle_figures = {"healthz_p99_ms": round(p99(idle.samples), 1), "probes": len(idle.samples)}
            log(f"idle: {idle_figures}")
            tool = Load(body=_tool_body(args.tool_result_mb), authed=True, rounds=args.rounds,
                        seconds=args.hostile_seconds, path="/v1/chat/completions")
            tools = await hostile_scenario(url, tool, args.tool_clients)
            log(f"tool results: {tools}")
            if args.only == "tool_results":
                return {"healthz_p99_ms_tool_results": tools["healthz_p99_ms"],
                        "target_ms": TARGETS["healthz_p99_ms_tool_results"], "idle": idle_figures,
                        "tool_results": tools, "tool_result_bytes": len(tool.body)}
            streams = await streams_scenario(url, args.streams)
            log(f"streams: {streams}")
            log("hostile bodies without a key")
            hostile_load = Load(body=hostile, authed=False, rounds=args.rounds, seconds=args.hostile_seconds)
            unauth = await hostile_scenario(url, hostile_load, args.hostile_clients)
            log(f"without a key: {unauth}; now with a key")
            authed = await hostile_scenario(url, replace(hostile_load, authed=True), args.hostile_clients)
            log(f"with a key: {authed}")
            malformed = await malformed_requests(url)
        finally:
            await asyncio.to_thread(cluster.stop)
    figures = {
        "healthz_p99_ms_streams": streams["healthz_p99_ms"],
        "healthz_p99_ms_hostile_body": max(unauth["healthz_p99_ms"], authed["healthz_p99_ms"]),
        "healthz_p99_ms_tool_results": tools["healthz_p99_ms"],
        "max_error_bytes": max([unauth["max_error_bytes"], authed["max_error_bytes"], *malformed]),
    }
    return {
        **figures,
        "targets": TARGETS,
        "met": {name: figures[name] <= target for name, target in TARGETS.items()},
        "idle": idle_figures,
        "streams": streams,
        "hostile_unauthenticated": unauth,
        "hostile_authenticated": authed,
        "tool_results": tools,
        "malformed_error_bytes": malformed,
        "setup": {
            "streams": args.streams,
            "deltas_per_stream": args.deltas,
            "hostile_clients": args.hostile_clients,
            "hostile_keys": args.hostile_keys,
            "hostile_body_bytes": len(hostile),
            "rounds": args.rounds,
            "hostile_seconds": args.hostile_seconds,
            "service_src": args.service_src or "this tree (shipped)",
            "workers": 1,
            "store": "sqlite",
            "settings": "shipped defaults (stream flush 50 ms / 2048 bytes, 20000 keys+items)",
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--deltas", type=int, default=5000)
    parser.add_argument("--hostile-clients", type=int, default=4)
    parser.add_argument("--hostile-keys", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=200, help="bodies per hostile client at most")
    parser.add_argument("--hostile-seconds", type=float, default=8.0, help="...and for at most this long")
    parser.add_argument("--tool-clients", type=int, default=2)
    parser.add_argument("--tool-result-mb", type=float, default=9.6)
    parser.add_argument("--only", choices=["tool_results"], default=None, help="run one scenario (and idle)")
    parser.add_argument(
        "--service-src", default=None,
        help="eval-only: run the worker from another source tree (e.g. main's, for a before/after figure)",
    )
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    print(json.dumps(result, indent=2), file=sys.stderr)
    print(json.dumps(result, separators=(",", ":")))


if __name__ == "__main__":
    main()
