"""The LangChain and LlamaIndex LoCoMo benchmark modules (benchmarks/integrations/) on a
small LoCoMo-shaped file, loaded the way bench_integrations.py loads them (by path, the
shared helpers as ``_locomo``): the contract it relies on, and evidence recall through
each adapter at least the library's own evaluation of the same file (which also spends
tokens on the engine's system prompt)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "integrations"
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
            {"question": "How was Ann's commute?", "answer": "late", "evidence": ["D1:6"], "category": 4},
            {"question": "Adversarial", "answer": "", "evidence": ["D1:2"], "category": 5},
        ],
    }]
    file = path / "locomo" / "locomo_dev.json"
    file.parent.mkdir()
    file.write_text(json.dumps(data), encoding="utf-8")
    return path


def _load(monkeypatch: pytest.MonkeyPatch, stem: str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{stem}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("stem", ["langchain", "llama_index"])
def test_benchmark_module_measures_through_the_adapter(stem: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from contextmode.evaluation.locomo import evaluate_locomo

    _load(monkeypatch, "_locomo", "_locomo")
    bench = _load(monkeypatch, stem, f"bench_integration_{stem}")
    assert isinstance(bench.NAME, str) and bench.NAME
    data = _locomo(tmp_path)
    result = bench.measure(data, 200, None)
    assert result["questions"] == 4  # categories 1-4 only
    library = evaluate_locomo(data / "locomo" / "locomo_dev.json", [200], ["default"], progress=False)
    row = library["table"]["default"]["200"]
    assert row["questions"] == 4
    assert 0 < row["recall"] < 1  # the budget leaves some evidence out: a real comparison (200 tokens)
    # At least the library's evidence: the adapter sends no system prompt of the engine's (the
    # application's own is the persona), so those tokens go to memory.
    assert result["recall"] >= row["recall"] - 1e-4
    assert result["overhead_ms_p50"] > 0
