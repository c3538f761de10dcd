"""Several service workers on loopback, for multi-worker tests and the load benchmark.

A worker is ``uvicorn --factory contextmode.testing.worker:create_worker_app``: the
normal service (`create_app`) around ``build_engine()`` from the environment
(``CONTEXTMODE_STORE_URL``, ``CONTEXTMODE_LLM_BASE_URL``/``_MODEL``…), plus two test knobs:

| env var | meaning |
|---|---|
| ``CONTEXTMODE_WORKER_SUMMARY_LOG`` | swap the summariser for `RecordingSummarizer`, appending one JSON line per call to this file |
| ``CONTEXTMODE_WORKER_SUMMARY_DELAY_MS`` | how long each recorded summary call takes, milliseconds (default 0) |

The app drains its background jobs at shutdown (SIGTERM), so a test can stop the
workers and then read a settled store. `Cluster` starts the stub model server and
the workers as child processes, each with its log file; `converse`
(`contextmode.testing.conversations`, re-exported here) is one simulated user who
sends a multi-turn conversation to random workers and retries on another worker
when a connection fails.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..processors.base import SummaryResult
from ..types import Summary, Turn
from .conversations import Conversation, SentTurn, converse, message_for, turn_index

__all__ = [
    "SUMMARY_DELAY_ENV",
    "SUMMARY_LOG_ENV",
    "Cluster",
    "Conversation",
    "RecordingSummarizer",
    "SentTurn",
    "WorkerProcess",
    "converse",
    "create_worker_app",
    "message_for",
    "read_summary_log",
    "turn_index",
    "warm_up",
]

SUMMARY_LOG_ENV = "CONTEXTMODE_WORKER_SUMMARY_LOG"
SUMMARY_DELAY_ENV = "CONTEXTMODE_WORKER_SUMMARY_DELAY_MS"

# -- the worker app ---------------------------------------------------------------


class RecordingSummarizer:
    """A deterministic summariser that appends ``{"pid", "session", "from", "to", "t"}``
    (one JSON line, one ``O_APPEND`` write) to ``path`` at every call, so calls from
    every process can be counted. The session comes from the turns' `message_for` tags."""

    def __init__(self, path: str | Path, *, delay_s: float = 0.0) -> None:
        self.path = Path(path)
        self.delay_s = delay_s

    async def summarize(self, previous: Summary | None, turns: Sequence[Turn]) -> SummaryResult:
        tags = (turn_index(t.content) for t in turns)
        session = next((tag[0] for tag in tags if tag is not None), "?")
        first, last = turns[0].seq, turns[-1].seq
        record = {"pid": os.getpid(), "session": session, "from": first, "to": last, "t": time.time()}
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(record) + "\n").encode())
        finally:
            os.close(fd)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return SummaryResult(text=f"对话第 1-{last} 轮的摘要（本次 {first}-{last}）。")


def read_summary_log(path: str | Path) -> list[dict[str, Any]]:
    """The records `RecordingSummarizer` wrote, in write order (``[]`` if none yet)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def create_worker_app() -> Any:
    """The service app for one worker process (a uvicorn ``--factory``)."""
    from ..api import build_engine, default_processors
    from ..service import create_app

    if log_path := os.environ.get(SUMMARY_LOG_ENV):
        recording = RecordingSummarizer(log_path, delay_s=float(os.environ.get(SUMMARY_DELAY_ENV) or 0) / 1000)
        engine = build_engine(processors=lambda model: replace(default_processors(model), summarizer=recording))
    else:
        engine = build_engine()
    app = create_app(engine)
    inner = app.router.lifespan_context

    # create_app leaves an engine it was given open; this one is ours, so finish its
    # background jobs and close the store when uvicorn shuts down.
    @asynccontextmanager
    async def lifespan(app_: Any) -> AsyncIterator[Any]:
        await warm_up(engine)
        async with inner(app_) as state:
            yield state
        await engine.close()

    app.router.lifespan_context = lifespan
    return app


async def warm_up(engine: Any) -> None:
    """Run each offline processor once before serving, and stream one short answer from the
    model, so the first requests and jobs do not pay for loading lexicons, models and the
    HTTP client's lazily imported modules (≈ 2 s on a busy 2-core box)."""
    from ..types import ChatMessage, utc_now

    turn = Turn(seq=1, role="user", content="我不吃辣，预算两千以内。I'm vegetarian.", tokens=12, created_at=utc_now())
    try:
        engine.counter.count(turn.content)
        await engine.emotion.score(turn.content)
        await engine.detector.detect("那个呢？", [turn])
        await engine.extractor.extract(turn, ())
        async for _ in engine.model.stream([ChatMessage(role="user", content="ping")], max_tokens=1):
            pass
    except Exception as exc:  # a cold start is slower, not broken
        logging.getLogger("contextmode.worker").warning("warm-up failed: %s", exc)


# -- processes --------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class WorkerProcess:
    """One uvicorn worker on a loopback port; stdout and stderr go to ``log_path``."""

    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    _terminated: bool = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: no shutdown hook runs, held locks stay until they expire."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def terminate(self) -> None:
        """SIGTERM once: uvicorn stops accepting, finishes requests, the app drains its jobs.

        uvicorn ≥ 0.29 re-raises the signal after its graceful shutdown, so a clean
        exit has return code ``-15`` (or 0)."""
        if self.alive() and not self._terminated:
            self._terminated = True
            self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout_s: float = 60.0) -> int:
        """`terminate`, then wait; SIGKILL after ``timeout_s``."""
        if self.alive():
            self.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return int(self.process.returncode)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def _wait_healthy(url: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url} exited with {process.returncode} before it was healthy")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not become healthy within {timeout_s} s")


@dataclass
class Cluster:
    """The stub model server and ``workers`` service workers, all children of this process.

    ``env`` is added to every worker's environment; ``worker_env`` maps a worker's
    index to extra variables for that one only. Use as a context manager, or call
    `start` and `stop`.
    """

    workers: int
    store_url: str
    log_dir: Path
    env: Mapping[str, str] = field(default_factory=dict)
    worker_env: Mapping[int, Mapping[str, str]] = field(default_factory=dict)
    stub_latency_ms: float = 0.0
    stub_args: Sequence[str] = ()
    """Extra arguments of the stub server (``--chunk-chars 1``, ``--reply-chars 5000``…)."""
    model: str = "gpt-4o-mini"
    """Model name sent to the stub; also picks the token counter (o200k, bundled)."""
    processes: list[WorkerProcess] = field(default_factory=list)
    stub: subprocess.Popen[bytes] | None = None
    stub_url: str = ""

    def start(self, timeout_s: float = 60.0) -> Cluster:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._start_stub()
        for i in range(self.workers):
            self.processes.append(self._spawn(i))
        for worker in self.processes:
            _wait_healthy(worker.url, worker.process, timeout_s)
        return self

    def _start_stub(self) -> None:
        args = [sys.executable, "-m", "contextmode.testing.stub_server", "--port", "0", "--no-record",
                "--model", self.model, "--latency-ms", str(self.stub_latency_ms), *self.stub_args]
        stderr = (self.log_dir / "stub.log").open("wb")
        self.stub = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=stderr)
        stderr.close()
        assert self.stub.stdout is not None
        line = self.stub.stdout.readline().decode()
        found = re.search(r"(http://\S+)", line)
        if not found:
            self.stub.kill()
            raise RuntimeError(f"the stub server did not start: {line!r}")
        self.stub_url = found.group(1)

    def _spawn(self, index: int) -> WorkerProcess:
        port = _free_port()
        env = {
            **os.environ,
            "CONTEXTMODE_STORE_URL": self.store_url,
            "CONTEXTMODE_LLM_BASE_URL": self.stub_url,
            "CONTEXTMODE_LLM_MODEL": self.model,
            "CONTEXTMODE_LLM_API_KEY": "stub",
            **self.env,
            **self.worker_env.get(index, {}),
        }
        log_path = self.log_dir / f"worker-{index}.log"
        args = [sys.executable, "-m", "uvicorn", "--factory", "contextmode.testing.worker:create_worker_app",
                "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", "--no-access-log",
                "--http", "httptools", "--loop", "uvloop", "--timeout-keep-alive", "75"]
        with log_path.open("wb") as log:
            process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        return WorkerProcess(port=port, process=process, log_path=log_path)

    @property
    def urls(self) -> list[str]:
        return [w.url for w in self.processes]

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop every live worker gracefully (jobs drained), then the stub server."""
        for worker in self.processes:
            worker.terminate()
        for worker in self.processes:
            worker.stop(timeout_s)
        if self.stub is not None and self.stub.poll() is None:
            self.stub.terminate()
            try:
                self.stub.wait(10)
            except subprocess.TimeoutExpired:
                self.stub.kill()

    def __enter__(self) -> Cluster:
        try:
            return self.start()
        except BaseException:
            self.stop(10)
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
