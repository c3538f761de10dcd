"""A local HTTP server speaking the OpenAI chat-completions protocol, with fault knobs.

Standard library only (``ThreadingHTTPServer``), so tests and load tests can run
the real ``openai`` client over real HTTP without a model::

    server = StubServer(reply=lambda req: "你好", first_token_delay=0.05)
    with server as base_url:                  # http://127.0.0.1:<free port>/v1
        server.fail_next(429, count=2)        # the next two chat requests get 429
        ...
        assert server.chat_requests[-1].last_user == "hi"

or as a process: ``python -m contextmode.testing.stub_server --port 8901 --latency-ms 200``
(prints ``stub server listening on http://127.0.0.1:8901/v1`` once ready).

Endpoints: ``POST /v1/chat/completions`` (``stream`` true → SSE ``data: {chunk}`` …
``data: [DONE]`` over chunked encoding; false → one JSON body), ``GET /v1/models``,
``POST /v1/embeddings`` (`StubServer.embed`, by default `hashed_embedding`), with ``llamacpp_window`` llama.cpp's ``GET /props`` and ``POST /tokenize``, and for a server in another process ``POST /_stub/fault`` (JSON ``{"kind": …,
"count": …, …}``), ``POST /_stub/reset``, ``GET /_stub/requests``. A chat request's
``max_tokens`` / ``max_completion_tokens`` cut the answer (``length``), its ``stop`` strings
end it (``stop``, with vLLM's ``stop_reason``), ``logprobs`` adds made-up log probabilities,
``n`` more choices (not streamed); every answer carries an ``x-request-id`` header.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import signal
import threading
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from typing import Any, cast

from ..models.caching import cacheable_prefix_tokens, request_text
from ..types import ChatMessage, Role
from ._stub_http import Fault, FaultKind, StubAnswer, StubRequest, StubToolCall, _Handler
from .counters import CharTokenCounter

__all__ = [
    "Fault",
    "FaultKind",
    "StubAnswer",
    "StubOptions",
    "StubReply",
    "StubRequest",
    "StubServer",
    "StubToolCall",
    "echo_reply",
    "hashed_embedding",
    "main",
    "tool_agent_reply",
]

class _StubHTTPServer(ThreadingHTTPServer):
    # The default listen backlog of 5 resets connections under a load test's burst.
    request_queue_size = 1024
    daemon_threads = True


StubReply = Callable[[StubRequest], "str | Iterable[str] | StubAnswer"]
"""Computes the answer from the request: a string (split into chunks), the chunks themselves,
or a `StubAnswer` with tool calls."""


def echo_reply(request: StubRequest) -> str:
    """Deterministic default answer that mentions the last user message."""
    return f"Stub answer to: {request.last_user}"


@dataclass(frozen=True, kw_only=True)
class StubOptions:
    """Where a `StubServer` listens, its random failures, and whether it keeps requests."""

    host: str = "127.0.0.1"
    port: int = 0
    """0 = a free port."""
    error_rate: float = 0.0
    """Share of chat requests answered 503."""
    seed: int = 0
    """Makes the random failures repeatable."""
    record: bool = True
    """Keep every request (off for long load tests)."""
    llamacpp_slots: int | None = None
    """With ``llamacpp_window``: the ``total_slots`` its ``GET /props`` reports (the stub itself
    answers any number of requests at once)."""


class StubServer:
    """OpenAI-protocol server on a loopback port, run in a background thread.

    Latency: ``first_token_delay`` and ``chunk_delay`` (seconds); answers stream
    in pieces of ``chunk_chars`` characters. `StubOptions`: the address, an ``error_rate``
    answering that share of chat requests with 503 (``seed`` makes it repeatable), and
    whether requests are kept. Faults queue with
    ``fail_next``, ``hang_next``, ``malformed_next``, ``truncate_next``,
    ``unfinished_next``, ``reset_next``.
    """

    def __init__(
        self,
        reply: StubReply | None = None,
        *,
        model: str = "stub-model",
        first_token_delay: float = 0.0,
        chunk_delay: float = 0.0,
        chunk_chars: int = 4,
        llamacpp_window: int | None = None,
        options: StubOptions | None = None,
    ) -> None:
        options = options or StubOptions()
        self.reply = reply or echo_reply
        self.host, self.port, self.model = options.host, options.port, model
        self.first_token_delay, self.chunk_delay = first_token_delay, chunk_delay
        self.chunk_chars = max(1, chunk_chars)
        self.error_rate = options.error_rate
        self.record = options.record
        self.llamacpp_window = llamacpp_window
        self.llamacpp_slots = options.llamacpp_slots
        """When set, the stub acts as llama.cpp's server: ``GET /props`` reports this ``n_ctx``,
        ``POST /tokenize`` counts tokens, ``/v1/models`` says ``owned_by: llamacpp``, a
        ``json_schema`` response format is refused (with llama-cpp-python's 500 and its validation
        error), a chat request whose
        prompt plus ``max_tokens`` exceeds the window with 400 (llama-cpp-python's words, see `overflows`)."""
        self._random = random.Random(options.seed)
        self._lock = threading.Lock()
        self._faults: deque[Fault] = deque()
        self._requests: list[StubRequest] = []
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._counter = CharTokenCounter()
        self._last_prompt: str | None = None
        self._call_serial = 0
        self.embed: Callable[[str], Sequence[float]] = hashed_embedding
        """The vector ``POST /v1/embeddings`` answers for one text (replace it to give the stub
        a "model" that knows which words mean alike)."""
        self.overflows: list[int] = []
        """With ``llamacpp_window``: the tokens asked by each chat request refused as larger than
        the window (prompt plus ``max_tokens``, as llama-cpp-python's server refuses them)."""

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """Base URL to give the client, ending in ``/v1``."""
        if self._httpd is None:
            raise RuntimeError("the stub server is not running")
        return f"http://{self.host}:{self._httpd.server_address[1]}/v1"

    def start(self) -> str:
        """Bind (port 0 = a free one), serve in a daemon thread and return `url`."""
        handler = type("_BoundHandler", (_Handler,), {"stub": self})
        self._stopping.clear()
        self._httpd = _StubHTTPServer((self.host, self.port), handler)
        # A short poll interval keeps stop() fast (shutdown waits for one poll).
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, name="stub-server", daemon=True
        )
        self._thread.start()
        return self.url

    def stop(self) -> None:
        """Stop serving; hanging requests are released and their connections closed."""
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = self._thread = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- knobs -----------------------------------------------------------------------------
    def add_fault(self, fault: Fault, count: int = 1) -> None:
        """Queue ``fault`` for the next ``count`` chat-completions requests."""
        with self._lock:
            self._faults.extend([fault] * count)

    def fail_next(
        self, status: int = 500, *, count: int = 1, retry_after: float | None = 0.001, message: str = ""
    ) -> None:
        """Answer the next ``count`` chat requests with HTTP ``status`` (429, 500, 503…);
        ``retry_after`` seconds go out as ``retry-after-ms``, ``message`` as the error message."""
        self.add_fault(Fault(kind="status", status=status, retry_after=retry_after, message=message), count)

    def hang_next(self, *, count: int = 1, seconds: float = 300.0) -> None:
        """Accept the next ``count`` chat requests and send nothing (client timeouts)."""
        self.add_fault(Fault(kind="hang", hang_seconds=seconds), count)

    def malformed_next(self, *, count: int = 1) -> None:
        """Answer with a body (or SSE data line) that is not valid JSON."""
        self.add_fault(Fault(kind="malformed"), count)

    def truncate_next(self, *, count: int = 1, after_chunks: int = 1) -> None:
        """Stream ``after_chunks`` content chunks, then close the connection mid-stream."""
        self.add_fault(Fault(kind="truncate", after_chunks=after_chunks), count)

    def unfinished_next(self, *, count: int = 1) -> None:
        """Stream the whole answer and ``[DONE]`` but never a ``finish_reason``."""
        self.add_fault(Fault(kind="unfinished"), count)

    def reset_next(self, *, count: int = 1) -> None:
        """Reset the TCP connection (RST) instead of answering."""
        self.add_fault(Fault(kind="reset"), count)

    def reset(self) -> None:
        """Forget queued faults and recorded requests."""
        with self._lock:
            self._faults.clear()
            self._requests.clear()
            self.overflows.clear()

    @property
    def requests(self) -> list[StubRequest]:
        """Every request received so far, oldest first (a copy)."""
        with self._lock:
            return list(self._requests)

    @property
    def chat_requests(self) -> list[StubRequest]:
        """The chat-completions requests received so far."""
        return [r for r in self.requests if r.path.rstrip("/").endswith("/chat/completions")]

    # -- used by the handler ---------------------------------------------------------------
    def _log(self, request: StubRequest) -> None:
        if self.record:
            with self._lock:
                self._requests.append(request)

    def _next_fault(self) -> Fault | None:
        with self._lock:
            if self._faults:
                return self._faults.popleft()
            if self.error_rate and self._random.random() < self.error_rate:
                return Fault(kind="status", status=503)
        return None

    def _answer(self, request: StubRequest) -> tuple[list[str], str, tuple[StubToolCall, ...]]:
        """The reply's chunks, finish reason (``length`` when ``max_tokens`` cut it, tokens as
        `CharTokenCounter` counts them; ``tool_calls`` when it made calls; ``stop:<string>`` when
        cut before the first of the request's ``stop`` strings, sent as vLLM does, ``finish_reason``
        ``stop`` with ``stop_reason`` the string) and tool calls."""
        answer = self.reply(request)
        if isinstance(answer, StubAnswer):
            with self._lock:
                self._call_serial += len(answer.tool_calls)
                serial = self._call_serial
            calls = tuple(
                c if c.id else StubToolCall(name=c.name, arguments=c.arguments, id=f"call_{serial - len(answer.tool_calls) + i}")
                for i, c in enumerate(answer.tool_calls)
            )
            n = self.chunk_chars
            chunks = [answer.text[i : i + n] for i in range(0, len(answer.text), n)] or [""]
            return chunks, "tool_calls" if calls else "stop", calls
        chunks, finish = self._text_answer(request, answer)
        return chunks, finish, ()

    def _text_answer(self, request: StubRequest, answer: str | Iterable[str]) -> tuple[list[str], str]:
        n = self.chunk_chars
        chunks = [answer[i : i + n] for i in range(0, len(answer), n)] if isinstance(answer, str) else list(answer)
        body = request.body if isinstance(request.body, dict) else {}
        limit = body.get("max_tokens") or body.get("max_completion_tokens")
        text = "".join(chunks)
        text, matched = _cut_at_stop(text, body.get("stop"))
        if matched:  # a stop sequence: the text before it, finish "stop"
            chunks = [text[i : i + n] for i in range(0, len(text), n)]
        if not isinstance(limit, int) or self._counter.count(text) <= limit:
            return chunks or [""], f"stop:{matched}" if matched else "stop"
        low, high = 0, len(text)  # longest prefix within the limit
        while low < high:
            mid = (low + high + 1) // 2
            low, high = (mid, high) if self._counter.count(text[:mid]) <= limit else (low, mid - 1)
        cut = text[:low].rstrip()
        return [cut[i : i + n] for i in range(0, len(cut), n)] or [""], "length"

    def _overflow(self, request: StubRequest) -> str | None:
        """With ``llamacpp_window``: llama-cpp-python's message refusing a request whose prompt
        plus ``max_tokens`` exceeds the window (recorded in `overflows`), else ``None``."""
        body = request.body if isinstance(request.body, dict) else {}
        limit = body.get("max_tokens") or body.get("max_completion_tokens")
        prompt = self._usage(request, "")["prompt_tokens"]
        asked = prompt + (limit if isinstance(limit, int) else 0)
        if self.llamacpp_window is None or asked <= self.llamacpp_window:
            return None
        with self._lock:
            self.overflows.append(asked)
        return (f"This model's maximum context length is {self.llamacpp_window} tokens. However, you requested "
                f"{asked} tokens ({prompt} in the messages, {asked - prompt} in the completion). "
                "Please reduce the length of the messages or completion.")

    def _usage(self, request: StubRequest, answer: str) -> dict[str, Any]:
        """Usage as a caching server reports it: ``prompt_tokens_details.cached_tokens`` is the
        part of the prompt that is a byte-identical prefix of the previous chat request's (a
        prompt cache of one entry, as a llama.cpp slot keeps; `models.caching`)."""
        prompt = sum(self._counter.count(str(m.get("content") or "")) + 4 for m in request.messages) + 3
        completion = self._counter.count(answer)
        text = request_text([ChatMessage(role=cast(Role, m.get("role", "user")), content=str(m.get("content") or ""))
                             for m in request.messages])
        with self._lock:
            previous, self._last_prompt = self._last_prompt, text
        cached = min(prompt, cacheable_prefix_tokens(previous, text, self._counter))
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached}}

    def _sleep(self, seconds: float) -> bool:
        """Sleep unless the server stops first; False when it is stopping."""
        return not (seconds > 0 and self._stopping.wait(seconds)) and not self._stopping.is_set()


def _cut_at_stop(text: str, stop: object) -> tuple[str, str]:
    """``text`` up to the first of the ``stop`` strings (one or a list) it holds, and that
    string; ``(text, "")`` when it holds none."""
    strings = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
    found = sorted((text.find(s), s) for s in strings if isinstance(s, str) and s and s in text)
    return (text[: found[0][0]], found[0][1]) if found else (text, "")


EMBEDDING_DIM = 64
"""Size of the stub's `hashed_embedding` vectors."""


def hashed_embedding(text: str, dim: int = EMBEDDING_DIM) -> list[float]:
    """A deterministic bag-of-words vector: each lower-cased word adds 1 to the bucket its CRC-32
    names (not normalised: the client must do that). Texts sharing words point alike."""
    vector = [0.0] * dim
    for word in re.findall(r"\w+", text.lower()):
        vector[zlib.crc32(word.encode()) % dim] += 1.0
    return vector


def tool_agent_reply(tools: Iterable[str] = ("search", "read_file"), *, rounds: int = 2, parallel: int = 2) -> StubReply:
    """A model that works like an agent: to a user message it answers with ``parallel`` calls
    of the offered tools (or of ``tools`` when the request offers none), and keeps calling for
    ``rounds`` rounds of results before it answers in text."""
    names = tuple(tools)

    def reply(request: StubRequest) -> StubAnswer:
        body = request.body if isinstance(request.body, dict) else {}
        offered = [t.get("function", {}).get("name") for t in body.get("tools") or () if isinstance(t, dict)]
        usable = [n for n in offered if isinstance(n, str)] or list(names)
        since_user = 0
        for message in reversed(request.messages):
            if message.get("role") == "user":
                break
            if message.get("role") == "assistant" and message.get("tool_calls"):
                since_user += 1
        if since_user >= rounds or body.get("tool_choice") == "none" or not usable:
            return StubAnswer(text=f"Stub answer after {since_user} tool rounds to: {request.last_user}")
        query = request.last_user[:40]
        calls = tuple(
            StubToolCall(name=usable[i % len(usable)], arguments=json.dumps({"query": query, "part": i}, ensure_ascii=False))
            for i in range(parallel)
        )
        return StubAnswer(tool_calls=calls)

    return reply


def _fixed_length_reply(length: int) -> StubReply:
    def reply(request: StubRequest) -> str:
        text = echo_reply(request)
        filler = " lorem ipsum dolor sit amet"
        while len(text) < length:
            text += filler
        return text[:length]

    return reply


def main(argv: Iterable[str] | None = None) -> None:
    """Run the stub server as a process until SIGINT/SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m contextmode.testing.stub_server", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = a free port (printed)")
    parser.add_argument("--model", default="stub-model")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="delay before the first token")
    parser.add_argument("--chunk-delay-ms", type=float, default=0.0, help="delay between chunks")
    parser.add_argument("--chunk-chars", type=int, default=4)
    parser.add_argument("--reply-chars", type=int, default=0, help="pad/cut every answer to this many characters")
    parser.add_argument("--error-rate", type=float, default=0.0, help="share of chat requests answered 503")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-record", action="store_true", help="do not keep requests (long load tests)")
    args = parser.parse_args(list(argv) if argv is not None else None)
    server = StubServer(
        _fixed_length_reply(args.reply_chars) if args.reply_chars > 0 else None,
        model=args.model,
        first_token_delay=args.latency_ms / 1000,
        chunk_delay=args.chunk_delay_ms / 1000,
        chunk_chars=args.chunk_chars,
        options=StubOptions(
            host=args.host, port=args.port, error_rate=args.error_rate, seed=args.seed, record=not args.no_record
        ),
    )
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    print(f"stub server listening on {server.start()}", flush=True)
    try:
        done.wait()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
