"""The framework adapters against the library: evidence recall on LoCoMo and adapter overhead.

For each framework module ``benchmarks/integrations/<name>.py`` (``NAME: str`` and
``measure(data_dir, budget, limit) -> {"recall", "overhead_ms_p50", "questions"}``), LoCoMo
dev is recorded the way `contextmode.evaluation.locomo` records it, every question of
categories 1-4 is asked through the framework's adapter, and evidence recall is scored on
what the adapter returned (the turn's text as a message of its own, or inside the key-moment
or recall section). ``library_recall`` is the same measure through the library
(`evaluate_locomo`, the shipped strategy). Overhead: the adapter's wall time per question
minus the time spent inside `ContextMode` (translation, the hop to the memory's loop thread):
p50 over the questions of the least of three asks (``overhead_ms_p50``; the first ask alone
is ``overhead_ms_p50_first``, which on a shared machine mostly measures thread wake-ups).

Goals (issue 20): recall within ±0.005 of the library's at 2,000 tokens; overhead p50 ≤ 2 ms.
The adapters send no system prompt of the engine's (issue 40), so at small budgets their
recall may pass the library's, which spends those tokens on it.

    python benchmarks/bench_integrations.py --data ../shared/data --limit 1 [--only openai_agents]

Prints a table and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
FRAMEWORKS = HERE / "integrations"


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def discover(only: list[str] | None = None) -> list[ModuleType]:
    """Every framework module (files without a leading underscore), by file name. The folder
    is not put on ``sys.path`` (``pydantic_ai.py`` would shadow the package); the helpers the
    modules share (``_locomo.py``) are importable as ``_locomo``."""
    _load(FRAMEWORKS / "_locomo.py", "_locomo")
    modules = []
    for path in sorted(FRAMEWORKS.glob("*.py")):
        if path.name.startswith("_") or (only and path.stem not in only):
            continue
        module = _load(path, f"bench_integration_{path.stem}")
        if not isinstance(getattr(module, "NAME", None), str) or not callable(getattr(module, "measure", None)):
            raise SystemExit(f"{path} must define NAME: str and measure(data_dir, budget, limit)")
        modules.append(module)
    return modules


def library_recall(data_dir: Path, budget: int, limit: int | None) -> dict[str, float]:
    """Evidence recall through the library (`evaluate_locomo`, shipped settings) on the same
    conversations."""
    from contextmode.evaluation.locomo import evaluate_locomo
    from contextmode.memory import get_strategy
    from contextmode.settings import EngineSettings

    source = data_dir / "locomo" / "locomo_dev.json"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "locomo.json"
        samples = json.loads(source.read_text(encoding="utf-8"))
        path.write_text(json.dumps(samples[:limit] if limit else samples), encoding="utf-8")
        strategy = get_strategy(EngineSettings().strategy).name
        result = evaluate_locomo(path, [budget], [strategy], progress=False)
    row = result["table"][strategy][str(budget)]
    return {"recall": float(row["recall"]), "questions": float(row["questions"])}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--budget", type=int, default=2000)
    parser.add_argument("--limit", type=int, default=None, help="first N conversations only")
    parser.add_argument("--only", nargs="*", help="framework module names")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    modules = discover(args.only)
    library = library_recall(args.data, args.budget, args.limit)
    rows: dict[str, dict[str, float]] = {}
    for module in modules:
        figures = module.measure(args.data, args.budget, args.limit)
        figures["delta"] = round(figures["recall"] - library["recall"], 4)
        figures["ratio"] = round(figures["recall"] / library["recall"], 4) if library["recall"] else 0.0
        rows[module.NAME] = figures
    print(f"LoCoMo dev, {args.budget} tokens, {'all' if not args.limit else args.limit} conversation(s): "
          f"library recall {library['recall']:.4f} over {library['questions']:.0f} questions")
    print("framework | recall | delta | ratio | overhead p50 ms (first ask) | questions")
    for name, row in rows.items():
        print(f"{name} | {row['recall']:.4f} | {row['delta']:+.4f} | {row['ratio']:.4f} | "
              f"{row['overhead_ms_p50']:.3f} ({row.get('overhead_ms_p50_first', 0.0):.3f}) | {row['questions']:.0f}")
    out = {"budget": args.budget, "limit": args.limit, "library": library, "frameworks": rows,
           "seconds": round(time.perf_counter() - started, 1)}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
