"""Cold `contextmode inspect`: a new process each run, CPU (user+sys of the child) and wall time.

Usage (one or more source trees, compared run for run, interleaved so the machine's load
falls on each alike; medians printed, a JSON line last):

    python benchmarks/bench_cold_inspect.py new=. [old=/tmp/old-checkout] [--runs 9] [--message 那家店几点关门？]

Each tree runs ``python -m contextmode inspect SESSION -m MESSAGE`` with its own ``src`` on
``PYTHONPATH``, against one SQLite session under ``--home`` (default: a folder in the temporary
directory), which is filled first with a 20-message Chinese conversation through the shipped
`Engine` if it does not exist. One unmeasured run per tree first writes bytecode and caches
(as an installed wheel has them). Python keeps its bytecode (``PYTHONDONTWRITEBYTECODE`` is
dropped for the children).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MESSAGES = [
    "我不吃辣，预算五十以内", "推荐一家餐厅", "那家店在哪？", "详细一点", "举个例子", "还有别的推荐吗",
    "第二家店在哪", "预算改成一百元", "那它几点关门？", "周末也开吗？", "帮我总结一下这周的计划",
    "我对花生过敏", "明天去杭州出差", "推荐一个酒店", "离西湖近一点的", "价格多少", "有早餐吗",
    "好的，就这个", "谢谢", "再见",
]
_SEED = """
import asyncio, json, sys
from contextmode.api import build_engine
async def main():
    engine = build_engine()
    for message in json.loads(sys.argv[2]):
        await engine.turn("local", sys.argv[1], message)
    await engine.drain()
    await engine.close()
asyncio.run(main())
"""


def _env(home: Path, src: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(CONTEXTMODE_HOME=str(home), PYTHONPATH=str(src / "src"))
    return env


def _run(src: Path, home: Path, session: str, message: str) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "contextmode", "inspect", session, "-m", message],
                   env=_env(home, src), cwd=src, stdout=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return cpu * 1000, wall * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+", help="label=path of a checkout (its src/ is used)")
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--message", default="…")
    parser.add_argument("--session", default="cold")
    parser.add_argument("--home", type=Path, default=Path(tempfile.gettempdir()) / "contextmode-cold-inspect")
    args = parser.parse_args()
    trees = {label: Path(path).resolve() for label, path in (t.split("=", 1) for t in args.trees)}
    first = next(iter(trees.values()))
    if not (args.home / "contextmode.db").exists():
        subprocess.run([sys.executable, "-c", _SEED, args.session, json.dumps(MESSAGES)],
                       env=_env(args.home, first), check=True)
    for src in trees.values():  # bytecode, the vocabulary and jieba caches
        _run(src, args.home, args.session, args.message)
    runs: dict[str, dict[str, list[float]]] = {label: {"cpu": [], "wall": []} for label in trees}
    for _ in range(args.runs):
        for label, src in trees.items():
            cpu, wall = _run(src, args.home, args.session, args.message)
            runs[label]["cpu"].append(cpu)
            runs[label]["wall"].append(wall)
    result: dict[str, object] = {}
    for label, r in runs.items():
        row = {
            "cpu_median_ms": round(statistics.median(r["cpu"])), "cpu_min_ms": round(min(r["cpu"])),
            "wall_median_ms": round(statistics.median(r["wall"])), "wall_min_ms": round(min(r["wall"])),
            "runs": args.runs,
        }
        result[label] = row
        print(f"{label:8s} CPU median {row['cpu_median_ms']} ms (min {row['cpu_min_ms']}), "
              f"wall median {row['wall_median_ms']} ms (min {row['wall_min_ms']})")
    medians = [statistics.median(r["cpu"]) for r in runs.values()]
    if len(medians) == 2:
        result["cpu_ratio"] = round(medians[1] / medians[0], 3)
    print(json.dumps({"message": args.message, "load_avg_1m": os.getloadavg()[0], **result}, ensure_ascii=False))


if __name__ == "__main__":
    main()
