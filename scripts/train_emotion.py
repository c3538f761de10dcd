"""Train the emotion model shipped in contextmode/processors/data (seed 001).

    pip install -e '.[train]'
    python scripts/train_emotion.py --cped ../shared/data/cped/valid_split.csv \
        --esconv ../shared/data/esconv/valid.jsonl

The recipe (`contextmode.evaluation.emotion_train.fit_recipe`) is fitted on all of the
given dev files: the Chinese text model and context stage on CPED, the calibration
on CPED (Chinese) and ESConv (English). The model records the SHA-256 of each file and a
content hash of each dialogue, so `contextmode eval emotion` marks these files (or parts
of them) ``in_sample: true``. Held-out figures: ``contextmode eval emotion --cv 5``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from contextmode.evaluation.emotion_data import (
    cped_dialogue_hashes,
    dialogue_hash,
    file_sha256,
    read_cped,
    read_esconv,
)
from contextmode.evaluation.emotion_train import ZhFeatures, fit_recipe
from contextmode.processors.emotion_model import DEFAULT_MODEL_FILE

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "src" / "contextmode" / "processors" / "data" / DEFAULT_MODEL_FILE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cped", type=Path, required=True, help="CPED valid_split.csv")
    parser.add_argument("--esconv", type=Path, help="ESConv valid.jsonl (English calibration)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)

    started = time.time()
    rows = read_cped(args.cped)
    conversations = read_esconv(args.esconv) if args.esconv else []
    training: list[dict[str, object]] = [{
        "name": args.cped.name, "format": "cped", "sha256": file_sha256(args.cped),
        "items": len(rows), "dialogues": cped_dialogue_hashes(rows), "fitted": "all stages"}]
    if args.esconv:
        training.append({
            "name": args.esconv.name, "format": "esconv", "sha256": file_sha256(args.esconv),
            "items": len(conversations),
            "dialogues": [dialogue_hash(c.turns) for c in conversations],
            "fitted": "English calibration shift"})
    data = ZhFeatures.of(rows)
    model = fit_recipe(data, np.arange(len(rows)), conversations, seed=args.seed, info={
        "script": "scripts/train_emotion.py", "training": training})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(model.to_json(), ensure_ascii=False) + "\n", encoding="utf-8")
    print(json.dumps({
        "saved": str(args.out), "bytes": args.out.stat().st_size, "c": (model.info or {})["c"],
        "context": model.context.weights, "calibration": {k: vars(v) for k, v in model.calibration.items()},
        "nonzero_weights": len(model.weights), "seconds": round(time.time() - started, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
