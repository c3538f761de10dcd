"""The adapters' LoCoMo benchmark modules (benchmarks/integrations/) on a small
LoCoMo-shaped file: the contract bench_integrations relies on, and recall through each
adapter equal to the library's own on the same questions."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FILLER = [
    "The weather was grey all day so I stayed in and tidied the flat, then read for a while.",
    "Work has been busy, lots of meetings about the quarterly report and the budget review.",
    "Traffic was terrible this morning, the bus was twenty minutes late and very crowded.",
    "We watched a documentary about whales last night, pretty relaxing after a long week.",
]


def _locomo(path: Path) -> Path:
    turns = [("Ann", "My sister Marmalade lives in Lisbon and teaches piano to children."),
             ("Bob", "That sounds lovely, Lisbon is a beautiful city."),
             ("Ann", "I adopted a grey cat called Pixel from the shelter last spring.")]
    turns += [("Ann" if i % 2 == 0 else "Bob", f"{FILLER[i % 4]} ({i})") for i in range(24)]
    session = [{"speaker": s, "dia_id": f"D1:{i + 1}", "text": t} for i, (s, t) in enumerate(turns)]
    data = [{
        "sample_id": "tiny-1",
        "conversation": {"speaker_a": "Ann", "speaker_b": "Bob",
                         "session_1_date_time": "1:56 pm on 8 May, 2023", "session_1": session},
        "qa": [
            {"question": "Where does Ann's sister Marmalade live?", "answer": "Lisbon", "evidence": ["D1:1"], "category": 4},
            {"question": "What is the name of Ann's cat?", "answer": "Pixel", "evidence": ["D1:3"], "category": 4},
            {"question": "What did they watch?", "answer": "whales", "evidence": ["D1:27"], "category": 1},
            {"question": "Adversarial", "answer": "", "evidence": ["D1:2"], "category": 5},
        ],
    }]
    file = path / "locomo_dev.json"
    file.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.mark.slow
@pytest.mark.parametrize("module", ["langchain", "llama_index"])
def test_benchmark_module_measures_through_the_adapter(module: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    bench = importlib.import_module(f"benchmarks.integrations.{module}")
    assert isinstance(bench.NAME, str) and bench.NAME
    result = bench.measure(_locomo(tmp_path), 400, None)
    assert result["questions"] == 3  # categories 1-4 only
    assert 0 < result["recall"] <= 1
    assert result["recall"] == result["library_recall"]
    assert result["overhead_ms_p50"] > 0
    limited = bench.measure(tmp_path, 400, 1)
    assert limited["questions"] == 1 and limited["recall"] == 1.0
