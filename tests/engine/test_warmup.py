"""`warm_up`: loads what the first context would load, calls no model, writes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from contextmode.api import build_engine
from contextmode.engine import Processors
from contextmode.engine.warmup import warm_up
from contextmode.models.offline import OfflineResponder
from contextmode.processors.base import Detection
from contextmode.types import Turn

SRC = Path(__file__).resolve().parents[2] / "src"

_COLD_PROCESS = """
import asyncio, sys
from contextmode.api import build_engine
from contextmode.engine.warmup import warm_up
from contextmode.models.offline import OfflineResponder
from contextmode.text.tokens import tokenizer
engine = build_engine(store="memory://", model=OfflineResponder())
def loaded():
    cut = tokenizer.cache_info().currsize == 1 and tokenizer().initialized
    return (cut, "jieba.posseg" in sys.modules, engine.detector._model is not None)
before = loaded()
asyncio.run(warm_up(engine))
after = loaded()
print(before, after)
"""


def test_a_cold_process_loads_jieba_its_tagger_and_the_detector_model() -> None:
    out = subprocess.run([sys.executable, "-c", _COLD_PROCESS], capture_output=True, text=True,
                         env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin",
                              "CONTEXTMODE_HOME": os.environ["CONTEXTMODE_HOME"]}, timeout=300, check=True)
    assert out.stdout.strip() == "(False, False, False) (True, True, True)"


class _ModelDetector:
    """A detector that would call a model (not `ModelFree`): warming up must not run it."""

    def __init__(self) -> None:
        self.calls = 0

    async def detect(self, message: str, history: Sequence[Turn]) -> Detection:
        self.calls += 1
        return Detection(needs_context=False)


async def test_warm_up_skips_a_processor_that_may_call_a_model_and_writes_nothing() -> None:
    detector = _ModelDetector()
    engine = build_engine(store="memory://", model=OfflineResponder(),
                          processors=replace(Processors.offline(), detector=detector))
    try:
        assert await warm_up(engine) > 0
        assert detector.calls == 0
        assert list(await engine.store.list_sessions("local")) == []
    finally:
        await engine.close()


async def test_a_failed_warm_up_does_not_stop_the_service(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    import httpx

    from contextmode.processors.base import ModelFree
    from contextmode.service import ServiceSettings, create_app

    class Broken(ModelFree):
        async def detect(self, message: str, history: Sequence[Turn]) -> Detection:
            raise RuntimeError("broken on the sample")

    engine = build_engine(store="memory://", model=OfflineResponder(),
                          processors=replace(Processors.offline(), detector=Broken()))
    app = create_app(engine, ServiceSettings(image_dir=tmp_path / "images"))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            assert (await client.get("/healthz")).status_code == 200


_COLD_SUMMARY = """
import asyncio, sys
from contextmode.api import build_engine
from contextmode.engine.warmup import warm_up
from contextmode.models.offline import OfflineResponder
engine = build_engine(store="memory://", model=OfflineResponder())
before = "jieba.analyse" in sys.modules
asyncio.run(warm_up(engine))
print(before, "jieba.analyse" in sys.modules)
"""


def test_a_cold_process_loads_the_offline_summarizers_keyword_table() -> None:
    # The first summary job would otherwise load jieba's IDF table (~0.2 s of CPU) mid-service.
    out = subprocess.run([sys.executable, "-c", _COLD_SUMMARY], capture_output=True, text=True,
                         env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin",
                              "CONTEXTMODE_HOME": os.environ["CONTEXTMODE_HOME"]}, timeout=300, check=True)
    assert out.stdout.strip() == "False True"
