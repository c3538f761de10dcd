"""Client CPU per streamed model call: what `OpenAIChatModel` costs the worker per reply (issue #15).

Run: ``python benchmarks/bench_model_call.py`` (``--quick`` for fewer calls, ``--transport
httpx|aiohttp`` to pick the HTTP client under the SDK; default: whatever `OpenAIChatModel`
builds by itself). The last line printed is a JSON object.

The stub model server (``python -m contextmode.testing.stub_server``, OpenAI protocol,
no delay) runs in a child process, so its CPU is not counted; it answers every call with
an 85-character reply in 22 SSE chunks of 4 characters (plus the role chunk, the finish
chunk, usage and ``[DONE]``). This process streams replies with ``OpenAIChatModel.stream``
(slots off, usage asked, the shipped deadline and reply cap) and measures its own CPU
(``time.process_time``, all threads) around each round of ``in_flight`` calls run at once,
1 and 8 in flight. The figure is the median over rounds of CPU per call, in milliseconds;
wall time per round is printed too. The connection pool is warm (keep-alive) before the
first measured round, as in a serving worker.

- ``cpu_ms_per_call_p50_1`` / ``cpu_ms_per_call_p50_8``: client CPU per streamed call,
  1 and 8 calls in flight.
- ``wall_ms_per_round_p50_1`` / ``wall_ms_per_round_p50_8``: wall time of one round.
- ``transport``: the HTTP client the SDK ran on (``httpx``, ``aiohttp``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import re
import statistics
import subprocess
import sys
import time
from typing import Any

from contextmode.models.openai import OpenAIChatModel, OpenAIOptions
from contextmode.types import ChatMessage

REPLY_CHARS = 85
CHUNK_CHARS = 4  # 85 characters → 22 content chunks
MESSAGES = [
    ChatMessage(role="system", content="You are a helpful assistant. Answer briefly."),
    ChatMessage(role="user", content="What is a good hotel near West Lake for two nights, under 2000 yuan?"),
]


def start_stub() -> tuple[subprocess.Popen[bytes], str]:
    """The stub server in a child process, and its base URL."""
    args = [sys.executable, "-m", "contextmode.testing.stub_server", "--port", "0", "--no-record",
            "--reply-chars", str(REPLY_CHARS), "--chunk-chars", str(CHUNK_CHARS)]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert process.stdout is not None
    line = process.stdout.readline().decode()
    found = re.search(r"(http://\S+)", line)
    if not found:
        process.kill()
        raise RuntimeError(f"the stub server did not start: {line!r}")
    return process, found.group(1)


def build_model(base_url: str, transport: str) -> OpenAIChatModel:
    """The model as a worker builds it (``default``), or over a named HTTP client."""
    options = OpenAIOptions(slots=0)
    if transport == "default":
        return OpenAIChatModel(model="stub-model", base_url=base_url, max_retries=0, options=options)
    import openai

    http_client: Any = openai.DefaultAioHttpClient() if transport == "aiohttp" else openai.DefaultAsyncHttpxClient()
    client = openai.AsyncOpenAI(api_key="not-needed", base_url=base_url, max_retries=0, timeout=60.0,
                                http_client=http_client)
    return OpenAIChatModel(model="stub-model", base_url=base_url, options=OpenAIOptions(slots=0, client=client))


async def one_call(model: OpenAIChatModel) -> None:
    text = "".join([piece async for piece in model.stream(MESSAGES)])
    if len(text) != REPLY_CHARS:
        raise RuntimeError(f"unexpected reply of {len(text)} characters: {text!r}")


async def rounds(model: OpenAIChatModel, in_flight: int, count: int) -> tuple[list[float], list[float]]:
    """CPU ms per call and wall ms of each of ``count`` rounds of ``in_flight`` calls at once."""
    cpu, wall = [], []
    for _ in range(count):
        c0, w0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(one_call(model) for _ in range(in_flight)))
        c1, w1 = time.process_time(), time.perf_counter()
        cpu.append((c1 - c0) * 1000 / in_flight)
        wall.append((w1 - w0) * 1000)
    return cpu, wall


async def bench(base_url: str, transport: str, calls: int) -> dict[str, Any]:
    model = build_model(base_url, transport)
    # before this change the model had no ``transport`` and always ran on httpx
    built = getattr(model, "transport", "httpx") if transport == "default" else transport
    result: dict[str, Any] = {"transport": built, "built_as": transport}
    try:
        await rounds(model, 8, 10)  # warm: lazy imports, 8 pooled connections
        gc.collect()
        for in_flight in (1, 8):
            cpu, wall = await rounds(model, in_flight, max(5, calls // in_flight))
            result[f"cpu_ms_per_call_p50_{in_flight}"] = round(statistics.median(cpu), 3)
            result[f"wall_ms_per_round_p50_{in_flight}"] = round(statistics.median(wall), 3)
            result[f"rounds_{in_flight}"] = len(cpu)
    finally:
        await model.aclose()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls")
    parser.add_argument("--transport", choices=["default", "httpx", "aiohttp"], default="default",
                        help="HTTP client under the SDK (default: the one OpenAIChatModel builds)")
    parser.add_argument("--calls", type=int, default=0, help="calls per concurrency level (default 400, quick 80)")
    args = parser.parse_args()
    calls = args.calls or (80 if args.quick else 400)
    stub, base_url = start_stub()
    try:
        result = asyncio.run(bench(base_url, args.transport, calls))
    finally:
        stub.terminate()
        stub.wait(timeout=10)
    import openai

    result |= {"openai": openai.__version__, "reply_chars": REPLY_CHARS, "chunk_chars": CHUNK_CHARS}
    for in_flight in (1, 8):
        print(f"{in_flight} in flight ({result['transport']}): client CPU {result[f'cpu_ms_per_call_p50_{in_flight}']} "
              f"ms per streamed call (median of {result[f'rounds_{in_flight}']} rounds), "
              f"wall {result[f'wall_ms_per_round_p50_{in_flight}']} ms per round")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
