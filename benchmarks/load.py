"""Load test: N simulated users against 1, 2, 4… service workers sharing PostgreSQL or Redis.

Run: ``python benchmarks/load.py --workers 1,2,4 --backend postgres`` (or ``--backend redis``;
``--users``, ``--turns``, ``--duration``, ``--latency-ms``). The last line printed is a JSON object.

For each worker count the script starts, on loopback only, the stub model server
(``python -m contextmode.testing.stub_server``, OpenAI protocol, ``--latency-ms``
before the first token) and that many uvicorn processes
(``contextmode.testing.worker:create_worker_app``: the real service on
``build_engine()`` with a fresh PostgreSQL schema / Redis namespace, the stub as
``CONTEXTMODE_LLM_BASE_URL``, offline processors, the ``default`` strategy (recent turns,
summary, pins, key moments and recall from the stored index), background summaries,
constraints and emotion scores). ``--users`` conversations then run at
once, each ``--turns`` non-stream turns one after the other, every request to a
random worker; a run stops after ``--turns`` turns per user or ``--duration``
seconds, whichever comes first (bounded in requests and in time).

Figures per worker count: acknowledged turns per second (wall clock of the whole
run), client-side latency p50 / p99 of one turn, errors, the time the workers then
needed to finish the background jobs (``jobs_drain_s``), and CPU milliseconds per turn
spent by the workers (turn + its background jobs, up to the end of the drain), the stub,
this load generator and, when it runs on this machine, the database server (PostgreSQL
backends or redis-server, from ``/proc``): they all share the machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from contextmode.testing.worker import Cluster, Conversation, converse

PG_DSN = os.environ.get("CONTEXTMODE_TEST_PG_DSN") or "postgresql://postgres@127.0.0.1:5432/test"
REDIS_URL = os.environ.get("CONTEXTMODE_TEST_REDIS_URL") or "redis://127.0.0.1:6379/0"


@asynccontextmanager
async def fresh_store(backend: str) -> AsyncIterator[str]:
    """A store URL on a throwaway schema / namespace, dropped afterwards."""
    tag = uuid.uuid4().hex[:10]
    if backend == "postgres":
        import asyncpg

        schema = f"cm_load_{tag}"
        try:
            yield f"{PG_DSN}{'&' if '?' in PG_DSN else '?'}schema={schema}"
        finally:
            conn = await asyncpg.connect(PG_DSN)
            try:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            finally:
                await conn.close()
    else:
        import redis.asyncio as aioredis

        namespace = f"cmload:{tag}:"
        try:
            yield f"{REDIS_URL}{'&' if '?' in REDIS_URL else '?'}namespace={namespace}"
        finally:
            client = aioredis.Redis.from_url(REDIS_URL)
            try:
                keys = [k async for k in client.scan_iter(match=f"{namespace}*", count=1000)]
                for i in range(0, len(keys), 1000):
                    await client.delete(*keys[i : i + 1000])
            finally:
                await client.aclose()


async def wait_for_jobs(
    client: httpx.AsyncClient, urls: list[str], sessions: list[str], pids: list[int], *, timeout_s: float
) -> tuple[float, float]:
    """Wait until the workers have finished every background job.

    Polling every session on every worker would itself cost the workers CPU, so this
    waits until the workers are idle (< 10 ms of CPU in 0.5 s), takes their CPU time
    then, and only confirms with one round of ``GET /v1/sessions/{id}`` (``pending_jobs``
    empty everywhere). Returns (seconds waited, the workers' CPU seconds when idle).
    """
    started = time.perf_counter()
    while True:
        busy = sum(cpu_seconds(p) for p in pids)
        await asyncio.sleep(0.5)
        idle_cpu = sum(cpu_seconds(p) for p in pids)
        if idle_cpu - busy > 0.01 and time.perf_counter() - started < timeout_s:
            continue
        replies = await asyncio.gather(
            *(client.get(f"{url}/v1/sessions/{sid}") for url in urls for sid in sessions), return_exceptions=True
        )
        # A pooled connection the worker closed (keep-alive timeout) fails once: ask again.
        done = all(
            isinstance(r, httpx.Response) and (r.status_code != 200 or not r.json()["data"]["stats"]["pending_jobs"])
            for r in replies
        )
        if done or time.perf_counter() - started >= timeout_s:
            return time.perf_counter() - started, idle_cpu


def route(urls: list[str], user: int, routing: str) -> list[str]:
    """The workers a user may talk to: all of them (``random``), or one per session (``session``)."""
    return urls if routing == "random" else [urls[user % len(urls)]]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (Linux ``/proc``; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_pids(backend: str) -> list[int]:
    """Pids of a local database server's processes (PostgreSQL backends, redis-server), if visible."""
    name = "postgres" if backend == "postgres" else "redis-server"
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == name:
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def rss_mib(pid: int) -> float:
    """Resident memory of a live process, MiB (Linux ``/proc``; 0 elsewhere)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (0–1) by nearest rank; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


async def run_once(workers: int, args: argparse.Namespace) -> dict[str, Any]:
    async with fresh_store(args.backend) as store_url:
        cluster = Cluster(
            workers=workers,
            store_url=store_url,
            log_dir=Path(tempfile.mkdtemp(prefix="contextmode-load-")),
            stub_latency_ms=args.latency_ms,
        )
        await asyncio.to_thread(cluster.start)
        try:
            pids = [w.pid for w in cluster.processes]
            assert cluster.stub is not None
            stub_pid = cluster.stub.pid
            rng = random.Random(args.seed)
            limits = httpx.Limits(max_connections=args.users * workers, max_keepalive_connections=args.users * workers)
            async with httpx.AsyncClient(timeout=120, limits=limits) as client:
                before = ([cpu_seconds(p) for p in pids], cpu_seconds(stub_pid), time.process_time())
                server_before = {p: cpu_seconds(p) for p in server_pids(args.backend)}
                started = time.perf_counter()
                deadline = time.monotonic() + args.duration
                conversations: list[Conversation] = await asyncio.gather(
                    *(
                        converse(client, route(cluster.urls, i, args.routing), f"load-{i:04d}", args.turns,
                                 rng=rng, deadline=deadline)
                        for i in range(args.users)
                    )
                )
                wall = time.perf_counter() - started
                client_cpu = time.process_time()
                sessions = [c.session_id for c in conversations]
                drain_s, workers_cpu = await wait_for_jobs(client, cluster.urls, sessions, pids, timeout_s=args.duration)
                after = (workers_cpu, cpu_seconds(stub_pid), client_cpu)
                # Backends opened during the run (pools grow) count from zero.
                server_cpu = sum(cpu_seconds(p) - server_before.get(p, 0.0) for p in server_pids(args.backend))
                rss = max(rss_mib(p) for p in pids)
        finally:
            await asyncio.to_thread(cluster.stop)
        errors = [e for c in conversations for e in c.http_errors]
        bad_logs = [w.pid for w in cluster.processes if "Traceback" in w.log()]
    latencies = [t.latency_s * 1000 for c in conversations for t in c.turns]
    turns = len(latencies)
    per_turn = max(turns, 1)
    result = {
        "turns": turns,
        "wall_s": round(wall, 2),
        "turns_per_s": round(turns / wall, 2) if wall else 0.0,
        "p50_ms": round(percentile(latencies, 0.50), 1),
        "p99_ms": round(percentile(latencies, 0.99), 1),
        "mean_ms": round(statistics.fmean(latencies), 1) if latencies else 0.0,
        "errors": len(errors),
        "worker_rss_mib_max": round(rss, 1),
        "jobs_drain_s": round(drain_s, 2),
        "workers_with_traceback": len(bad_logs),
        "cpu_ms_per_turn": {
            "workers": round(1000 * (after[0] - sum(before[0])) / per_turn, 1),
            "stub": round(1000 * (after[1] - before[1]) / per_turn, 1),
            "load_generator": round(1000 * (after[2] - before[2]) / per_turn, 1),
            "store_server": round(1000 * server_cpu / per_turn, 1),
        },
    }
    if errors:
        result["first_error"] = errors[0][:200]
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2,4", help="comma-separated worker counts to run, e.g. 1,2,4")
    parser.add_argument("--backend", choices=("postgres", "redis"), default="postgres")
    parser.add_argument("--users", type=int, default=32, help="concurrent simulated users")
    parser.add_argument("--turns", type=int, default=10, help="turns per user (caps requests at users × turns)")
    parser.add_argument("--duration", type=float, default=60.0, help="time cap of one run, seconds")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="stub model's delay before the first token")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--routing", choices=("random", "session"), default="random",
                        help="every request to a random worker, or each session always to the same one")
    args = parser.parse_args(argv)
    counts = [int(x) for x in args.workers.split(",") if x.strip()]
    if not counts or min(counts) < 1 or args.users < 1 or args.turns < 1 or args.duration <= 0:
        parser.error("worker counts, --users and --turns must be ≥ 1 and --duration > 0")

    results: dict[str, Any] = {}
    for workers in counts:
        result = asyncio.run(run_once(workers, args))
        results[str(workers)] = result
        print(
            f"{workers} worker(s): {result['turns']} turns in {result['wall_s']} s = {result['turns_per_s']} turns/s, "
            f"p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms, errors {result['errors']}, "
            f"CPU ms/turn {result['cpu_ms_per_turn']}",
            flush=True,
        )
    base = results[str(counts[0])]["turns_per_s"] or 1.0
    summary = {
        "benchmark": "load",
        "backend": args.backend,
        "users": args.users,
        "turns_per_user": args.turns,
        "duration_cap_s": args.duration,
        "stub_latency_ms": args.latency_ms,
        "routing": args.routing,
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "results": results,
        "speedup_vs_first": {k: round(v["turns_per_s"] / base, 2) for k, v in results.items()},
    }
    print(json.dumps(summary, ensure_ascii=False))


if __name__ == "__main__":
    main()
