"""Migrate and export at scale, through the shipped CLI: time, checksums, peak memory.

Run: ``python benchmarks/bench_lifecycle.py`` (``--migrate-turns``, ``--export-turns``
to change the sizes; ``--pg-dsn`` for the PostgreSQL target).

1. **migrate**: a SQLite store of ``--migrate-turns`` turns (default 100,000:
   200 sessions × 500 turns, with users, summaries and pins) is copied to a
   fresh PostgreSQL schema by ``contextmode migrate --from sqlite:///… --to
   postgresql://…`` (a child process); reported: wall time, turns per second,
   whether the command verified equal counts and checksums, both checksums.
2. **export**: ``contextmode export FILE --quiet`` of a SQLite store of
   ``--export-turns`` turns (default 1,000,000: 1,000 sessions × 1,000 turns),
   and of one tenth of it; reported: wall time and the child's peak RSS for
   both sizes (bounded memory means the two peaks are about equal).

Stores are filled with ``SQLiteStore.append`` in batches (the fill is not
timed). Turns are mixed Chinese/English chat of realistic length. The last
line is a JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from contextmode.store.sqlite import SQLiteStore
from contextmode.types import Constraint, NewTurn, SessionKey, Summary

_WORDS = ["预算", "五十元", "不要辣", "周末", "餐厅", "推荐", "the", "meeting", "budget", "地铁站",
          "附近", "咖啡", "report", "明天", "下午三点", "价格", "评价", "停车", "好的", "谢谢"]


_CONTEXTMODE = (sys.executable, "-c", "from contextmode.cli import main; main()")
"""The ``contextmode`` script, run by this interpreter (so PYTHONPATH applies)."""


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


async def fill(path: Path, sessions: int, turns_each: int, *, seed: int = 1) -> int:
    """A SQLite store of ``sessions`` × ``turns_each`` turns with users, summaries and pins."""
    rng = random.Random(seed)
    async with SQLiteStore(path, synchronous="OFF") as store:
        for k in range(sessions):
            sid, user = f"s-{k:05d}", f"u-{k % 97}"
            for start in range(0, turns_each, 1000):
                batch = [
                    NewTurn(role="user" if (start + i) % 2 == 0 else "assistant",
                            content=_text(rng, 8 if (start + i) % 2 == 0 else 30), tokens=12,
                            emotion=round(rng.random(), 3) if (start + i) % 2 == 0 else None,
                            metadata={"n": start + i})
                    for i in range(min(1000, turns_each - start))
                ]
                await store.append(SessionKey("bench", sid), batch, user_id=user)
            await store.commit_summary(SessionKey("bench", sid), Summary(text=_text(rng, 40), covers_seq=turns_each // 2,
                                                             tokens=60), expected_version=0)
            await store.commit_constraints(SessionKey("bench", sid), [Constraint(key="budget", value="五十元以内")],
                                           expected_version=0)
    return sessions * turns_each


def _cli(*args: str) -> tuple[float, str]:
    """Run ``contextmode ARGS`` in a child; (seconds, stdout)."""
    started = time.perf_counter()
    done = subprocess.run([*_CONTEXTMODE, *args], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "100"}, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"contextmode {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return elapsed, done.stdout


def _peak_of(*args: str) -> tuple[float, int]:
    # RUSAGE_CHILDREN keeps the maximum over all children so far: measure each export
    # in its own grandchild so its peak is its own.
    code = (
        "import resource, subprocess, sys, time; t = time.perf_counter();"
        "subprocess.run([sys.executable, '-c', 'from contextmode.cli import main; main()', *sys.argv[1:]],"
        " check=True,"
        " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL);"
        "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True).stdout
    seconds, kib = out.split()
    return float(seconds), int(kib) // 1024


async def _drop_schema(dsn: str, schema: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--migrate-turns", type=int, default=100_000)
    parser.add_argument("--export-turns", type=int, default=1_000_000)
    parser.add_argument("--pg-dsn", default=os.environ.get("CONTEXTMODE_TEST_PG_DSN",
                                                           "postgresql://postgres@127.0.0.1:5432/test"))
    args = parser.parse_args()
    result: dict[str, Any] = {"benchmark": "lifecycle", "entry_point": "contextmode CLI (child process)"}
    with tempfile.TemporaryDirectory(prefix="cm-bench-life-") as tmp:
        folder = Path(tmp)
        # -- migrate SQLite → PostgreSQL
        src = folder / "migrate.db"
        turns = asyncio.run(fill(src, args.migrate_turns // 500, 500))
        schema = f"cm_bench_{uuid.uuid4().hex[:10]}"
        try:
            seconds, out = _cli("migrate", "--from", f"sqlite:///{src}", "--to",
                                   f"{args.pg_dsn}?schema={schema}", "--quiet")
        finally:
            asyncio.run(_drop_schema(args.pg_dsn, schema))
        report = json.loads(out.strip().splitlines()[-1])
        result["migrate"] = {"turns": turns, "sessions": report["sessions"], "seconds": round(seconds, 2),
                             "turns_per_s": round(turns / seconds), "verified": report["verified"],
                             "source_sha256": report["source_sha256"], "target_sha256": report["target_sha256"]}
        print(f"migrate {turns} turns SQLite→PostgreSQL: {seconds:.1f} s, verified={report['verified']}",
              file=sys.stderr)
        src.unlink()
        # -- export 1/10 and all of the export size
        for label, size in (("export_small", args.export_turns // 10), ("export", args.export_turns)):
            db = folder / f"{label}.db"
            sessions = max(1, size // 1000)
            asyncio.run(fill(db, sessions, size // sessions))
            out_file = folder / f"{label}.jsonl"
            seconds, peak = _peak_of("export", str(out_file), "--store", f"sqlite:///{db}", "--quiet")
            result[label] = {"turns": size, "seconds": round(seconds, 2), "turns_per_s": round(size / seconds),
                             "peak_rss_mib": peak, "file_mib": round(out_file.stat().st_size / 2**20, 1)}
            print(f"{label}: {size} turns in {seconds:.1f} s, peak RSS {peak} MiB", file=sys.stderr)
            db.unlink()
            out_file.unlink()
    result["rss_ratio_10x_data"] = round(result["export"]["peak_rss_mib"] / result["export_small"]["peak_rss_mib"], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
