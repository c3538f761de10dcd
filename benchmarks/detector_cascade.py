"""The context detector on the real local model against the offline one and the cascade.

Run: ``python benchmarks/detector_cascade.py --restoration ../shared/data/restoration200k/valid.txt
--canard ../shared/data/canard/dev.json`` (needs the ``local-model`` extra; about 160 model calls).

A fixed sample of each file (``--seed``), split by the shipped offline model's probability: inside
its unsure band (`processors.detect.UNSURE_BAND`, where `LLMContextDetector` asks the model) and
outside it. Each item is scored by the offline detector, by `LLMContextDetector` without a
fallback (SmolLM2-135M through llama-cpp-python's server; no verdict counts as "standalone", as
the detector says then) and by the cascade (the offline verdict when it is sure, else the
model's, else the offline one). Printed: accuracy and F1 per system and stratum, and the model's
share of answers without a verdict. The last line is a JSON object.

Note: the shipped offline model was trained on these dev files, so its probabilities here are an
in-sample fit (fewer items fall in the band than on new data, and the offline figures flatter it);
the honest out-of-fold figures per band are ``scripts/train_detector.py --bands``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from contextmode.evaluation.followup import DetectionItem, load_detection_items
from contextmode.evaluation.metrics import binary_scores
from contextmode.models.openai import OpenAIChatModel
from contextmode.processors.detect import OfflineContextDetector
from contextmode.processors.llm import LLMContextDetector
from contextmode.testing.local_model import LOCAL_MODEL_ALIAS, llama_server
from contextmode.types import Turn


def _history(item: DetectionItem) -> list[Turn]:
    """The item's context as alternating turns ending with the assistant's."""
    n = len(item.context)
    return [Turn(seq=i + 1, role="assistant" if (n - i) % 2 else "user", content=text, tokens=len(text),
                 created_at=datetime(2026, 1, 1, tzinfo=UTC)) for i, text in enumerate(item.context)]


def _sample(items: list[DetectionItem], offline: OfflineContextDetector, n_in: int, n_out: int,
            rng: random.Random) -> list[tuple[DetectionItem, bool]]:
    """``n_in`` items the offline detector is unsure of and ``n_out`` it is sure of."""
    inside, outside = [], []
    for item in items:
        if item.context:
            (outside if offline.detect_texts(item.message, item.context).sure else inside).append(item)
    return [(i, True) for i in rng.sample(inside, min(n_in, len(inside)))] + \
        [(i, False) for i in rng.sample(outside, min(n_out, len(outside)))]


async def _run(url: str, sample: list[tuple[str, DetectionItem, bool]]) -> list[dict[str, object]]:
    model = OpenAIChatModel(model=LOCAL_MODEL_ALIAS, base_url=url, max_retries=0, timeout=60)
    llm = LLMContextDetector(model, timeout=60)
    offline = OfflineContextDetector()
    rows = []
    for name, item, unsure in sample:
        history = _history(item)
        off = await offline.detect(item.message, history)
        said = await llm.detect(item.message, history)
        verdict = said.reason.startswith("detect@")
        cascade = off.needs_context if off.sure else (said.needs_context if verdict else off.needs_context)
        rows.append({"data": name, "unsure": unsure, "gold": item.needs_context, "offline": off.needs_context,
                     "llm": said.needs_context, "llm_verdict": verdict, "cascade": cascade})
    await model.aclose()
    return rows


def _figures(rows: list[dict[str, object]]) -> dict[str, object]:
    gold = [bool(r["gold"]) for r in rows]
    out: dict[str, object] = {"n": len(rows), "llm_no_verdict": sum(not r["llm_verdict"] for r in rows)}
    for system in ("offline", "llm", "cascade"):
        s = binary_scores(gold, [bool(r[system]) for r in rows])
        out[system] = {"accuracy": round(s["accuracy"], 3), "f1": round(s["f1"], 3)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--restoration", type=Path, required=True)
    parser.add_argument("--canard", type=Path, required=True)
    parser.add_argument("--inside", type=int, default=60, help="items per file inside the band")
    parser.add_argument("--outside", type=int, default=20, help="items per file outside it")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng, offline = random.Random(args.seed), OfflineContextDetector()
    sample = [(name, item, unsure) for name, path in (("restoration200k", args.restoration), ("canard", args.canard))
              for item, unsure in _sample(load_detection_items(path), offline, args.inside, args.outside, rng)]
    with llama_server(Path(tempfile.mkdtemp(prefix="contextmode-detector-"))) as url:
        rows = asyncio.run(_run(url, sample))
    report: dict[str, object] = {}
    for name in ("restoration200k", "canard"):
        for stratum, unsure in (("inside", True), ("outside", False)):
            part = [r for r in rows if r["data"] == name and r["unsure"] == unsure]
            report[f"{name}/{stratum}"] = _figures(part)
            print(f"{name:16} {stratum:8}", report[f"{name}/{stratum}"])
    print(json.dumps(report))


if __name__ == "__main__":
    main()
