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
and for a server in another process ``POST /_stub/fault`` (JSON ``{"kind": …,
"count": …, …}``), ``POST /_stub/reset``, ``GET /_stub/requests``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import signal
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

from .counters import CharTokenCounter

__all__ = ["Fault", "StubReply", "StubRequest", "StubServer", "echo_reply", "main"]

FaultKind = Literal["status", "hang", "malformed", "truncate", "reset"]


@dataclass(frozen=True, kw_only=True)
class StubRequest:
    """One request the stub server received."""

    method: str
    path: str
    headers: Mapping[str, str]
    """Header names lower-cased."""
    body: Any
    """Parsed JSON body (``None`` when empty or not JSON)."""
    received_at: float = field(default_factory=time.time)
    """Unix time, seconds."""

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The chat messages of a chat-completions request."""
        return list(self.body.get("messages", [])) if isinstance(self.body, dict) else []

    @property
    def stream(self) -> bool:
        return bool(isinstance(self.body, dict) and self.body.get("stream"))

    @property
    def last_user(self) -> str:
        """Content of the last user message ('' if none)."""
        for message in reversed(self.messages):
            if message.get("role") == "user":
                return str(message.get("content") or "")
        return ""


@dataclass(frozen=True, kw_only=True)
class Fault:
    """A failure applied to the next chat-completions request(s)."""

    kind: FaultKind
    """``status``: HTTP error; ``hang``: never answer; ``malformed``: invalid JSON / SSE data;
    ``truncate``: stream some chunks then close without finish or ``[DONE]``; ``reset``: TCP reset."""
    status: int = 500
    """HTTP status for ``status`` faults."""
    retry_after: float | None = 0.001
    """Seconds sent as ``retry-after-ms`` with ``status`` faults (keeps client retries fast)."""
    after_chunks: int = 1
    """Content chunks sent before a ``truncate`` cuts the stream."""
    hang_seconds: float = 300.0
    """How long a ``hang`` lasts at most (the server's stop ends it sooner)."""


StubReply = Callable[[StubRequest], "str | Iterable[str]"]
"""Computes the answer from the request: a string (split into chunks) or the chunks themselves."""


def echo_reply(request: StubRequest) -> str:
    """Deterministic default answer that mentions the last user message."""
    return f"Stub answer to: {request.last_user}"


class StubServer:
    """OpenAI-protocol server on a loopback port, run in a background thread.

    Latency: ``first_token_delay`` and ``chunk_delay`` (seconds); answers stream
    in pieces of ``chunk_chars`` characters. ``error_rate`` answers that share of
    chat requests with 503 (``seed`` makes it repeatable). Faults queue with
    ``fail_next``, ``hang_next``, ``malformed_next``, ``truncate_next``, ``reset_next``.
    """

    def __init__(
        self,
        reply: StubReply | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        model: str = "stub-model",
        first_token_delay: float = 0.0,
        chunk_delay: float = 0.0,
        chunk_chars: int = 4,
        error_rate: float = 0.0,
        seed: int = 0,
        record: bool = True,
    ) -> None:
        self.reply = reply or echo_reply
        self.host, self.port, self.model = host, port, model
        self.first_token_delay, self.chunk_delay = first_token_delay, chunk_delay
        self.chunk_chars = max(1, chunk_chars)
        self.error_rate = error_rate
        self.record = record
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._faults: deque[Fault] = deque()
        self._requests: list[StubRequest] = []
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._counter = CharTokenCounter()

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
        self._httpd = ThreadingHTTPServer((self.host, self.port), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="stub-server", daemon=True)
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

    def fail_next(self, status: int = 500, *, count: int = 1, retry_after: float | None = 0.001) -> None:
        """Answer the next ``count`` chat requests with HTTP ``status`` (429, 500, 503…)."""
        self.add_fault(Fault(kind="status", status=status, retry_after=retry_after), count)

    def hang_next(self, *, count: int = 1, seconds: float = 300.0) -> None:
        """Accept the next ``count`` chat requests and send nothing (client timeouts)."""
        self.add_fault(Fault(kind="hang", hang_seconds=seconds), count)

    def malformed_next(self, *, count: int = 1) -> None:
        """Answer with a body (or SSE data line) that is not valid JSON."""
        self.add_fault(Fault(kind="malformed"), count)

    def truncate_next(self, *, count: int = 1, after_chunks: int = 1) -> None:
        """Stream ``after_chunks`` content chunks, then close the connection mid-stream."""
        self.add_fault(Fault(kind="truncate", after_chunks=after_chunks), count)

    def reset_next(self, *, count: int = 1) -> None:
        """Reset the TCP connection (RST) instead of answering."""
        self.add_fault(Fault(kind="reset"), count)

    def reset(self) -> None:
        """Forget queued faults and recorded requests."""
        with self._lock:
            self._faults.clear()
            self._requests.clear()

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

    def _chunks(self, request: StubRequest) -> list[str]:
        answer = self.reply(request)
        if isinstance(answer, str):
            n = self.chunk_chars
            return [answer[i : i + n] for i in range(0, len(answer), n)] or [""]
        return list(answer)

    def _usage(self, request: StubRequest, answer: str) -> dict[str, int]:
        prompt = sum(self._counter.count(str(m.get("content") or "")) + 4 for m in request.messages) + 3
        completion = self._counter.count(answer)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _sleep(self, seconds: float) -> bool:
        """Sleep unless the server stops first; False when it is stopping."""
        return not (seconds > 0 and self._stopping.wait(seconds)) and not self._stopping.is_set()


class _Handler(BaseHTTPRequestHandler):
    stub: StubServer
    protocol_version = "HTTP/1.1"
    server_version = "contextmode-stub/1"

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass

    def finish(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            super().finish()

    def _read_request(self) -> StubRequest:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        request = StubRequest(
            method=self.command,
            path=self.path,
            headers={k.lower(): v for k, v in self.headers.items()},
            body=body,
        )
        self.stub._log(request)
        return request

    def _send_json(self, status: int, payload: Any, headers: Mapping[str, str] | None = None) -> None:
        data = json.dumps(payload, ensure_ascii=False).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        request = self._read_request()
        path = request.path.split("?")[0].rstrip("/")
        if path.endswith("/models"):
            model = {"id": self.stub.model, "object": "model", "created": 0, "owned_by": "contextmode-stub"}
            self._send_json(200, {"object": "list", "data": [model]})
        elif path == "/_stub/requests":
            self._send_json(200, [asdict(r) for r in self.stub.requests])
        else:
            self._send_json(404, {"error": {"message": f"no route {path}", "type": "not_found"}})

    def do_POST(self) -> None:
        request = self._read_request()
        path = request.path.split("?")[0].rstrip("/")
        try:
            if path.endswith("/chat/completions"):
                self._chat(request)
            elif path == "/_stub/fault" and isinstance(request.body, dict):
                body = dict(request.body)
                try:
                    count = int(body.pop("count", 1))
                    self.stub.add_fault(Fault(**body), count)
                except (TypeError, ValueError) as exc:
                    self._send_json(400, {"error": {"message": f"bad fault: {exc}", "type": "invalid_request"}})
                    return
                self._send_json(200, {"queued": count})
            elif path == "/_stub/reset":
                self.stub.reset()
                self._send_json(200, {"reset": True})
            else:
                self._send_json(404, {"error": {"message": f"no route {path}", "type": "not_found"}})
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    # -- chat completions ------------------------------------------------------------------
    def _chat(self, request: StubRequest) -> None:
        stub = self.stub
        fault = stub._next_fault()
        if fault and fault.kind == "reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            self.connection.close()
            return
        if fault and fault.kind == "hang":
            stub._stopping.wait(fault.hang_seconds)
            self.close_connection = True
            return
        if fault and fault.kind == "status":
            headers = {}
            if fault.retry_after is not None:
                headers["retry-after-ms"] = str(max(1, int(fault.retry_after * 1000)))
            kind = "rate_limit_exceeded" if fault.status == 429 else "server_error"
            message = {"message": f"stub fault: HTTP {fault.status}", "type": kind, "code": kind}
            self._send_json(fault.status, {"error": message}, headers)
            return
        try:
            chunks = stub._chunks(request)
        except Exception as exc:  # a broken reply function is a 500, not a dead server thread
            self._send_json(500, {"error": {"message": f"stub reply failed: {exc}", "type": "server_error"}})
            return
        if request.stream:
            self._stream(request, chunks, fault)
        else:
            self._complete(request, chunks, fault)

    def _envelope(self, kind: str) -> dict[str, Any]:
        return {"id": f"chatcmpl-stub-{id(self)}", "object": kind, "created": int(time.time()), "model": self.stub.model}

    def _complete(self, request: StubRequest, chunks: list[str], fault: Fault | None) -> None:
        if not self.stub._sleep(self.stub.first_token_delay + self.stub.chunk_delay * max(0, len(chunks) - 1)):
            return
        answer = "".join(chunks)
        payload = self._envelope("chat.completion") | {
            "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}],
            "usage": self.stub._usage(request, answer),
        }
        data = json.dumps(payload, ensure_ascii=False).encode()
        if fault and fault.kind == "malformed":
            data = b'{"id": "chatcmpl-stub", "choices": [{"index": 0, "message": {"content": "trunc'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        if fault and fault.kind == "truncate":
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.close_connection = True
            return
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _event(self, payload: dict[str, Any] | str) -> None:
        text = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
        self._write_chunk(f"data: {text}\n\n".encode())

    def _stream(self, request: StubRequest, chunks: list[str], fault: Fault | None) -> None:
        stub = self.stub
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        base = self._envelope("chat.completion.chunk")
        self._event(base | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
        if not stub._sleep(stub.first_token_delay):
            return
        for index, chunk in enumerate(chunks):
            if fault and fault.kind == "truncate" and index >= fault.after_chunks:
                self.close_connection = True  # no terminating chunk: an incomplete body
                return
            if fault and fault.kind == "malformed" and index == 1:
                self._write_chunk(b'data: {"choices": [{"delta": {"content": "oops\n\n')
                continue
            if index and not stub._sleep(stub.chunk_delay):
                return
            self._event(base | {"choices": [{"index": 0, "delta": {"content": chunk}, "finish_reason": None}]})
        if fault and fault.kind == "truncate":
            self.close_connection = True
            return
        if fault and fault.kind == "malformed" and len(chunks) < 2:
            self._write_chunk(b"data: {not json}\n\n")
        self._event(base | {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        options = request.body.get("stream_options") if isinstance(request.body, dict) else None
        if isinstance(options, dict) and options.get("include_usage"):
            self._event(base | {"choices": [], "usage": stub._usage(request, "".join(chunks))})
        self._event("[DONE]")
        self._write_chunk(b"")


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
        host=args.host,
        port=args.port,
        model=args.model,
        first_token_delay=args.latency_ms / 1000,
        chunk_delay=args.chunk_delay_ms / 1000,
        chunk_chars=args.chunk_chars,
        error_rate=args.error_rate,
        seed=args.seed,
        record=not args.no_record,
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
