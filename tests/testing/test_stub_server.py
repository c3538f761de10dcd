"""The OpenAI-protocol stub server, spoken to with plain HTTP (no openai client)."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from contextmode.testing.stub_server import StubOptions, StubRequest, StubServer


@pytest.fixture
def server() -> Iterator[StubServer]:
    stub = StubServer(chunk_chars=5)
    stub.start()
    yield stub
    stub.stop()


def _post(url: str, path: str, body: dict[str, Any], timeout: float = 5) -> http.client.HTTPResponse:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    conn.request("POST", path, json.dumps(body), {"content-type": "application/json"})
    return conn.getresponse()


def _get(url: str, path: str) -> tuple[int, Any]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
    conn.request("GET", path)
    response = conn.getresponse()
    return response.status, json.loads(response.read())


def _chat(stream: bool, content: str = "你好", **extra: Any) -> dict[str, Any]:
    return {"model": "stub-model", "messages": [{"role": "user", "content": content}], "stream": stream, **extra}


def _events(raw: bytes) -> list[str]:
    return [line[len("data: ") :] for line in raw.decode().split("\n") if line.startswith("data: ")]


def test_binds_a_free_loopback_port_and_lists_models(server: StubServer) -> None:
    assert server.url.startswith("http://127.0.0.1:") and server.url.endswith("/v1")
    status, body = _get(server.url, "/v1/models")
    assert status == 200
    assert body["data"][0]["id"] == "stub-model"


def test_non_streaming_answer_echoes_the_last_user_message(server: StubServer) -> None:
    response = _post(server.url, "/v1/chat/completions", _chat(False, "空调制冷差怎么办?"))
    body = json.loads(response.read())
    assert response.status == 200
    assert body["choices"][0]["message"]["content"] == "Stub answer to: 空调制冷差怎么办?"
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["prompt_tokens"] > 0
    assert server.chat_requests[-1].last_user == "空调制冷差怎么办?"


def test_streaming_answer_is_sse_ending_with_done(server: StubServer) -> None:
    response = _post(server.url, "/v1/chat/completions", _chat(True, "hi", stream_options={"include_usage": True}))
    assert response.getheader("content-type") == "text/event-stream"
    events = _events(response.read())
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "Stub answer to: hi"
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0


def test_custom_reply_function_sees_the_request() -> None:
    seen: list[StubRequest] = []

    def reply(request: StubRequest) -> list[str]:
        seen.append(request)
        return ["a", "b", "c"]

    with StubServer(reply) as url:
        events = _events(_post(url, "/v1/chat/completions", _chat(True)).read())
    deltas = [json.loads(e)["choices"][0]["delta"].get("content") for e in events[:-1]]
    assert deltas[1:4] == ["a", "b", "c"]
    assert seen[0].stream and seen[0].messages[0]["content"] == "你好"


@pytest.mark.parametrize("status", [429, 500, 503])
def test_status_faults_apply_to_the_next_n_requests(server: StubServer, status: int) -> None:
    server.fail_next(status, count=2)
    statuses = [_post(server.url, "/v1/chat/completions", _chat(False)).status for _ in range(3)]
    assert statuses == [status, status, 200]


def test_truncated_stream_closes_without_done(server: StubServer) -> None:
    server.truncate_next(after_chunks=2)
    response = _post(server.url, "/v1/chat/completions", _chat(True, "truncate me please"))
    with pytest.raises(http.client.IncompleteRead) as info:
        response.read()
    events = _events(info.value.partial)
    assert "[DONE]" not in events
    assert len(events) == 3  # role chunk + two content chunks


def test_malformed_fault_sends_invalid_json(server: StubServer) -> None:
    server.malformed_next(count=2)
    body = _post(server.url, "/v1/chat/completions", _chat(False)).read()
    with pytest.raises(ValueError):
        json.loads(body)
    events = _events(_post(server.url, "/v1/chat/completions", _chat(True, "long enough answer")).read())
    assert any(_not_json(e) for e in events if e != "[DONE]")


def _not_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return True
    return False


def test_reset_fault_drops_the_connection(server: StubServer) -> None:
    server.reset_next()
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        _post(server.url, "/v1/chat/completions", _chat(False)).read()
    assert _post(server.url, "/v1/chat/completions", _chat(False)).status == 200


def test_hang_fault_sends_nothing_until_the_client_gives_up(server: StubServer) -> None:
    server.hang_next()
    with pytest.raises(TimeoutError):
        _post(server.url, "/v1/chat/completions", _chat(False), timeout=0.3)


def test_admin_endpoints_queue_faults_and_list_requests(server: StubServer) -> None:
    assert _post(server.url, "/_stub/fault", {"kind": "status", "status": 503, "count": 1}).status == 200
    assert _post(server.url, "/_stub/fault", {"kind": "nonsense-field-only", "bogus": 1}).status == 400
    assert _post(server.url, "/v1/chat/completions", _chat(False)).status == 503
    status, requests = _get(server.url, "/_stub/requests")
    assert status == 200 and requests[-1]["path"] == "/v1/chat/completions"
    assert _post(server.url, "/_stub/reset", {}).status == 200
    assert server.requests == []


def test_error_rate_is_reproducible_with_a_seed() -> None:
    def run() -> list[int]:
        with StubServer(options=StubOptions(error_rate=0.5, seed=7)) as url:
            return [_post(url, "/v1/chat/completions", _chat(False)).status for _ in range(8)]

    first = run()
    assert first == run()
    assert set(first) == {200, 503}


def test_runs_as_a_separate_process() -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "contextmode.testing.stub_server", "--port", "0", "--latency-ms", "1", "--reply-chars", "40"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("stub server listening on http://127.0.0.1:")
        url = line.rsplit(" ", 1)[1].strip()
        body = json.loads(_post(url, "/v1/chat/completions", _chat(False, "hi")).read())
        assert len(body["choices"][0]["message"]["content"]) == 40
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert "Warning" not in stderr


def test_max_tokens_cuts_the_answer_with_finish_reason_length(server: StubServer) -> None:
    body = json.loads(_post(server.url, "/v1/chat/completions", _chat(False, "hello", max_tokens=3)).read())
    choice = body["choices"][0]
    assert choice["message"]["content"] == "Stub answer to"  # three tokens: Stub / answer / to
    assert choice["finish_reason"] == "length"
    events = _events(_post(server.url, "/v1/chat/completions", _chat(True, "hello", max_tokens=3)).read())
    finishes = [json.loads(e)["choices"][0]["finish_reason"] for e in events[:-1]]
    assert finishes[-1] == "length"
