"""The HTTP side of the stub server: request records, faults and the request handler.

Private to `contextmode.testing.stub_server`, which re-exports what users need.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    import threading

__all__ = ["Fault", "FaultKind", "StubAnswer", "StubRequest", "StubToolCall"]

FaultKind = Literal["status", "hang", "malformed", "truncate", "unfinished", "reset"]


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
        """Content of the last user message, the text of its parts when it has parts ('' if none)."""
        for message in reversed(self.messages):
            if message.get("role") == "user":
                content = message.get("content") or ""
                if isinstance(content, list):
                    return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
                return str(content)
        return ""


@dataclass(frozen=True, kw_only=True)
class StubToolCall:
    """A tool call the stub model makes."""

    name: str
    arguments: str = "{}"
    """JSON text; streamed in pieces of a few characters."""
    id: str = ""
    """The call id; empty = one is made up (``call_<n>``)."""


@dataclass(frozen=True, kw_only=True)
class StubAnswer:
    """A reply with tool calls (a reply function may return this instead of text)."""

    text: str = ""
    tool_calls: tuple[StubToolCall, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Fault:
    """A failure applied to the next chat-completions request(s) (a ``status`` fault applies to
    an embeddings request too)."""

    kind: FaultKind
    """``status``: HTTP error; ``hang``: never answer; ``malformed``: invalid JSON / SSE data;
    ``truncate``: stream some chunks then close without finish or ``[DONE]``; ``unfinished``: a
    clean stream with ``[DONE]`` but no ``finish_reason``; ``reset``: TCP reset."""
    status: int = 500
    """HTTP status for ``status`` faults."""
    retry_after: float | None = 0.001
    """Seconds sent as ``retry-after-ms`` with ``status`` faults (keeps client retries fast)."""
    message: str = ""
    """Error message for ``status`` faults (default ``stub fault: HTTP <status>``)."""
    after_chunks: int = 1
    """Content chunks sent before a ``truncate`` cuts the stream."""
    hang_seconds: float = 300.0
    """How long a ``hang`` lasts at most (the server's stop ends it sooner)."""


class _Counts(Protocol):
    def count(self, text: str) -> int: ...


class _Stub(Protocol):
    """What the handler asks of its server (`stub_server.StubServer`), so this module does
    not import the server back."""

    model: str
    first_token_delay: float
    chunk_delay: float
    llamacpp_window: int | None
    llamacpp_slots: int | None
    embed: Callable[[str], Sequence[float]]
    _counter: _Counts
    _stopping: threading.Event

    @property
    def requests(self) -> list[StubRequest]: ...
    def add_fault(self, fault: Fault, count: int = 1) -> None: ...
    def reset(self) -> None: ...
    def _log(self, request: StubRequest) -> None: ...
    def _next_fault(self) -> Fault | None: ...
    def _answer(self, request: StubRequest) -> tuple[list[str], str, tuple[StubToolCall, ...]]: ...
    def _overflow(self, request: StubRequest) -> str | None: ...
    def _usage(self, request: StubRequest, answer: str) -> dict[str, int]: ...
    def _sleep(self, seconds: float) -> bool: ...


class _Handler(BaseHTTPRequestHandler):
    stub: _Stub
    _calls: tuple[StubToolCall, ...] = ()
    _matched = ""
    """The stop string the reply was cut at (sent as vLLM's ``stop_reason``), or ``""``."""
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # small SSE writes must leave at once, not after a delayed ACK
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
        if not request.path.startswith("/_stub/"):  # the control plane is not traffic
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
        llamacpp = self.stub.llamacpp_window
        if path.endswith("/models"):
            owner = "llamacpp" if llamacpp else "contextmode-stub"
            model = {"id": self.stub.model, "object": "model", "created": 0, "owned_by": owner}
            self._send_json(200, {"object": "list", "data": [model]})
        elif path == "/props" and llamacpp:
            props: dict[str, object] = {"default_generation_settings": {"n_ctx": llamacpp}}
            if self.stub.llamacpp_slots is not None:
                props["total_slots"] = self.stub.llamacpp_slots
            self._send_json(200, props)
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
            elif path.endswith("/embeddings"):
                self._embeddings(request)
            elif path == "/tokenize" and self.stub.llamacpp_window and isinstance(request.body, dict):
                count = self.stub._counter.count(str(request.body.get("content", "")))
                self._send_json(200, {"tokens": list(range(count))})
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

    # -- embeddings ------------------------------------------------------------------------
    def _embeddings(self, request: StubRequest) -> None:
        """OpenAI's ``POST /v1/embeddings``: one `StubServer.embed` vector per input, in order
        (a queued ``status`` fault answers it with that status instead)."""
        fault = self.stub._next_fault()
        if fault is not None and fault.kind == "status":
            message = fault.message or f"stub fault: HTTP {fault.status}"
            self._send_json(fault.status, {"error": {"message": message, "type": "stub_fault"}})
            return
        raw = request.body.get("input") if isinstance(request.body, dict) else None
        texts = [raw] if isinstance(raw, str) else raw
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            self._send_json(400, {"error": {"message": "'input' must be a string or a list of strings",
                                            "type": "invalid_request_error"}})
            return
        data = [{"object": "embedding", "index": i, "embedding": list(self.stub.embed(t))} for i, t in enumerate(texts)]
        tokens = sum(self.stub._counter.count(t) for t in texts)
        self._send_json(200, {"object": "list", "data": data, "model": self.stub.model,
                              "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

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
        requested = request.body.get("response_format") if isinstance(request.body, dict) else None
        if stub.llamacpp_window and isinstance(requested, dict) and requested.get("type") == "json_schema":
            # llama.cpp's servers take {"type": "json_object", "schema": …} and refuse json_schema;
            # llama-cpp-python with a 500 holding pydantic's validation error, in these words
            self._send_json(500, {"error": {"message": "1 validation error:\n  {'type': 'literal_error', "
                                            "'loc': ('body', 'response_format', 'type'), 'msg': \"Input should be "
                                            "'text' or 'json_object'\", 'input': 'json_schema'}",
                                            "type": "internal_server_error"}})
            return
        if stub.llamacpp_window and (overflow := stub._overflow(request)) is not None:
            # llama-cpp-python refuses a prompt plus max_tokens larger than its n_ctx, in these words
            self._send_json(400, {"error": {"message": overflow, "type": "invalid_request_error",
                                            "code": "context_length_exceeded"}})
            return
        if fault and fault.kind == "status":
            headers = {}
            if fault.retry_after is not None:
                headers["retry-after-ms"] = str(max(1, int(fault.retry_after * 1000)))
            kind = "rate_limit_exceeded" if fault.status == 429 else "server_error"
            text = fault.message or f"stub fault: HTTP {fault.status}"
            message = {"message": text, "type": kind, "code": kind}
            self._send_json(fault.status, {"error": message}, headers)
            return
        try:
            chunks, finish, calls = stub._answer(request)
        except Exception as exc:  # a broken reply function is a 500, not a dead server thread
            self._send_json(500, {"error": {"message": f"stub reply failed: {exc}", "type": "server_error"}})
            return
        self._calls = calls
        finish, _, self._matched = finish.partition(":")
        if request.stream:
            self._stream(request, chunks, finish, fault)
        else:
            self._complete(request, chunks, finish, fault)

    def _envelope(self, kind: str) -> dict[str, Any]:
        return {"id": f"chatcmpl-stub-{id(self)}", "object": kind, "created": int(time.time()), "model": self.stub.model}

    def _complete(self, request: StubRequest, chunks: list[str], finish: str, fault: Fault | None) -> None:
        if not self.stub._sleep(self.stub.first_token_delay + self.stub.chunk_delay * max(0, len(chunks) - 1)):
            return
        answer = "".join(chunks)
        message: dict[str, Any] = {"role": "assistant", "content": answer}
        if self._calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self._calls
            ]
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish}
        if self._matched:
            choice["stop_reason"] = self._matched
        if _wants_logprobs(request):
            choice["logprobs"] = _logprobs(chunks)
        n = request.body.get("n") if isinstance(request.body, dict) else None
        others = [  # n > 1 (not streamed): the other choices say which they are
            {"index": i, "message": {"role": "assistant", "content": f"{answer} (choice {i})"}, "finish_reason": finish}
            for i in range(1, n if isinstance(n, int) and 1 < n <= 8 else 1)
        ]
        payload = self._envelope("chat.completion") | {
            "choices": [choice, *others],
            "usage": self.stub._usage(request, answer),
        }
        data = json.dumps(payload, ensure_ascii=False).encode()
        if fault and fault.kind == "malformed":
            data = b'{"id": "chatcmpl-stub", "choices": [{"index": 0, "message": {"content": "trunc'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("x-request-id", f"req-stub-{id(self)}")
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

    def _stream_calls(self, base: dict[str, Any]) -> None:
        """Tool calls as OpenAI streams them: id and name first, then the arguments in pieces."""
        for index, call in enumerate(self._calls):
            head = {"index": index, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
            self._event(base | {"choices": [{"index": 0, "delta": {"tool_calls": [head]}, "finish_reason": None}]})
            for start in range(0, len(call.arguments), 8):
                piece = {"index": index, "function": {"arguments": call.arguments[start : start + 8]}}
                self._event(base | {"choices": [{"index": 0, "delta": {"tool_calls": [piece]}, "finish_reason": None}]})

    def _stream_content(
        self, base: dict[str, Any], chunks: list[str], fault: Fault | None, logprobs: bool = False
    ) -> bool:
        """The content chunks, with the fault's damage; False when the stream ended early."""
        stub = self.stub
        for index, chunk in enumerate(chunks):
            if fault and fault.kind == "truncate" and index >= fault.after_chunks:
                self.close_connection = True  # no terminating chunk: an incomplete body
                return False
            if fault and fault.kind == "malformed" and index == 1:
                self._write_chunk(b'data: {"choices": [{"delta": {"content": "oops\n\n')
                continue
            if index and not stub._sleep(stub.chunk_delay):
                return False
            choice: dict[str, Any] = {"index": 0, "delta": {"content": chunk}, "finish_reason": None}
            if logprobs:
                choice["logprobs"] = _logprobs([chunk])
            self._event(base | {"choices": [choice]})
        return True

    def _stream(self, request: StubRequest, chunks: list[str], finish: str, fault: Fault | None) -> None:
        stub = self.stub
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("x-request-id", f"req-stub-{id(self)}")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        base = self._envelope("chat.completion.chunk")
        self._event(base | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
        if not stub._sleep(stub.first_token_delay):
            return
        if not self._stream_content(base, chunks, fault, _wants_logprobs(request)):
            return
        if fault and fault.kind == "truncate":
            self.close_connection = True
            return
        if fault and fault.kind == "malformed" and len(chunks) < 2:
            self._write_chunk(b"data: {not json}\n\n")
        self._stream_calls(base)
        if not (fault and fault.kind == "unfinished"):
            last: dict[str, Any] = {"index": 0, "delta": {}, "finish_reason": finish}
            if self._matched:
                last["stop_reason"] = self._matched
            self._event(base | {"choices": [last]})
        options = request.body.get("stream_options") if isinstance(request.body, dict) else None
        if isinstance(options, dict) and options.get("include_usage"):
            self._event(base | {"choices": [], "usage": stub._usage(request, "".join(chunks))})
        self._event("[DONE]")
        self._write_chunk(b"")


def _wants_logprobs(request: StubRequest) -> bool:
    return bool(isinstance(request.body, dict) and request.body.get("logprobs"))


def _logprobs(pieces: list[str]) -> dict[str, Any]:
    """OpenAI's ``logprobs`` of a choice: one made-up entry per piece sent."""
    return {"content": [{"token": p, "logprob": -0.5, "bytes": list(p.encode()), "top_logprobs": []}
                        for p in pieces if p]}
