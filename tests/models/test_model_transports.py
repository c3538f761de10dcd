"""`OpenAIChatModel` over both HTTP clients the SDK runs on: aiohttp (``DefaultAioHttpClient``,
the default with the ``openai[aiohttp]`` extra) and httpx (the fallback): the same answers,
stream semantics and error mapping, whichever carries them."""

from __future__ import annotations

import asyncio
import importlib
import re
import socket
import struct
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import pytest

pytest.importorskip("openai")
pytest.importorskip("aiohttp")  # the `openai` extra brings it (openai[aiohttp])

import openai

from contextmode.errors import ModelError, ModelTimeout, ModelUnavailable
from contextmode.models import ModelUsage, OpenAIChatModel, OpenAIOptions, map_openai_error
from contextmode.testing.models import collect_stream
from contextmode.testing.stub_server import StubServer
from contextmode.types import ChatMessage

TRANSPORTS = ["httpx", "aiohttp"]
MESSAGES = [ChatMessage(role="user", content="空调制冷差怎么办?")]
ANSWER = "Stub answer to: 空调制冷差怎么办?"

MakeModel = Callable[..., OpenAIChatModel]


@pytest.fixture(params=TRANSPORTS)
async def make(request: pytest.FixtureRequest) -> AsyncIterator[MakeModel]:
    """Builds models whose SDK client runs on the parametrised HTTP client (passed in as
    ``client=``, as a caller may), and closes them after the test."""
    transport: str = request.param
    made: list[OpenAIChatModel] = []

    def build(url: str, *, timeout: float = 2.0, max_retries: int = 0, **options: Any) -> OpenAIChatModel:
        http: Any = openai.DefaultAioHttpClient() if transport == "aiohttp" else openai.DefaultAsyncHttpxClient()
        client = openai.AsyncOpenAI(api_key="sk-test-0123456789abcdef", base_url=url, timeout=timeout,
                                    max_retries=max_retries, http_client=http)
        model = OpenAIChatModel(model="stub-model", base_url=url,
                                options=OpenAIOptions(client=client, slots=0, **options))
        made.append(model)
        return model

    yield build
    for model in made:
        await model.aclose()


async def _collect(model: OpenAIChatModel) -> tuple[list[str], ModelError | None]:
    return await collect_stream(model, MESSAGES)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port  # nothing listens there once the socket is closed


def _event(payload: str) -> bytes:
    return f"data: {payload}\n\n".encode()


@asynccontextmanager
async def sse_server(events: Sequence[bytes], *, reset: bool = False) -> AsyncIterator[str]:
    """A loopback HTTP server in this loop answering every request with ``events`` as one
    chunked SSE body, then either the body's end or (``reset``) a TCP reset."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"(?i)content-length:\s*(\d+)", head)
            await reader.readexactly(int(length.group(1)) if length else 0)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                         b"transfer-encoding: chunked\r\n\r\n")
            for event in events:
                writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                await writer.drain()
            await asyncio.sleep(0.2)  # the client reads what was sent before the end
            if reset:
                writer.get_extra_info("socket").setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
                return
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            writer.close()
        except (ConnectionError, asyncio.IncompleteReadError):
            writer.transport.abort()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.close()


# -- answers ------------------------------------------------------------------------------

async def test_a_plain_reply_and_its_usage(make: MakeModel, server: StubServer) -> None:
    model = make(server.url)
    assert await model.complete(MESSAGES, max_tokens=50) == ANSWER
    assert server.chat_requests[-1].body["max_tokens"] == 50
    assert isinstance(model.last_usage, ModelUsage) and model.last_usage.completion_tokens > 0


async def test_streamed_chunks_in_order_then_finish_and_usage(make: MakeModel, server: StubServer) -> None:
    model = make(server.url)
    for _ in range(3):  # the pooled connection is reused after [DONE]
        chunks, error = await _collect(model)
        assert (chunks[:3], "".join(chunks), error) == (["Stu", "b a", "nsw"], ANSWER, None)
        assert model.last_finish_reason == "stop"
    assert server.chat_requests[-1].body["stream_options"] == {"include_usage": True}
    assert model.last_usage is not None and model.last_usage.prompt_tokens > 0
    results = await asyncio.gather(*(_collect(model) for _ in range(8)))
    assert all(("".join(c), e) == (ANSWER, None) for c, e in results)


async def test_an_error_object_mid_stream_is_a_model_error_after_the_partial_text(make: MakeModel) -> None:
    events = [_event('{"choices": [{"delta": {"content": "Hel"}}]}'),
              _event('{"error": {"message": "the server ran out of memory"}}')]
    async with sse_server(events) as url:
        chunks, error = await _collect(make(url))
    assert chunks == ["Hel"]
    assert type(error) is ModelError and "partial" in str(error) and "out of memory" in str(error)


# -- connection failures ------------------------------------------------------------------

async def test_a_refused_connection_is_unavailable(make: MakeModel) -> None:
    model = make(f"http://127.0.0.1:{_free_port()}/v1")
    with pytest.raises(ModelUnavailable) as info:
        await model.complete(MESSAGES)
    assert type(info.value) is ModelUnavailable
    chunks, error = await _collect(model)
    assert chunks == [] and type(error) is ModelUnavailable


async def test_a_reset_before_the_answer_is_unavailable(make: MakeModel, server: StubServer) -> None:
    model = make(server.url)
    server.reset_next(count=2)
    with pytest.raises(ModelUnavailable) as info:
        await model.complete(MESSAGES)
    assert type(info.value) is ModelUnavailable
    chunks, error = await _collect(model)
    assert chunks == [] and type(error) is ModelUnavailable
    assert "".join((await _collect(model))[0]) == ANSWER  # and the next call is served


async def test_a_server_closing_without_an_answer_is_unavailable(make: MakeModel, server: StubServer) -> None:
    model = make(server.url)
    server.hang_next(count=2, seconds=0.05)  # reads the request, then closes the connection
    with pytest.raises(ModelUnavailable) as info:
        await model.complete(MESSAGES)
    assert type(info.value) is ModelUnavailable
    chunks, error = await _collect(model)
    assert chunks == [] and type(error) is ModelUnavailable


def test_aiohttp_connection_errors_behind_a_timeout_are_connection_failures() -> None:
    import aiohttp

    def chained(cause: BaseException) -> BaseException:
        """What the SDK raises over aiohttp: APITimeoutError from httpx's ConnectTimeout from
        aiohttp's error (the transport's mapping, then the SDK's)."""
        http = importlib.import_module(openai.DefaultAsyncHttpxClient.__mro__[1].__module__.split(".")[0])
        try:
            try:
                try:
                    raise cause
                except aiohttp.ClientError as exc:
                    raise http.ConnectTimeout(str(exc)) from exc
            except http.ConnectTimeout as exc:
                raise openai.APITimeoutError(request=http.Request("POST", "http://127.0.0.1/v1")) from exc
        except openai.APITimeoutError as exc:
            return exc

    disconnected = chained(aiohttp.ServerDisconnectedError())
    reset = chained(aiohttp.ClientOSError(104, "Connection reset by peer"))
    assert type(map_openai_error(disconnected)) is ModelUnavailable
    assert type(map_openai_error(reset)) is ModelUnavailable
    assert type(map_openai_error(disconnected, mid_stream=True)) is ModelError
    assert type(map_openai_error(reset, mid_stream=True)) is ModelError
    timed_out = chained(aiohttp.SocketTimeoutError("Timeout on reading data from socket"))
    assert type(map_openai_error(timed_out)) is ModelTimeout  # a real timeout stays one
    assert type(map_openai_error(timed_out, mid_stream=True)) is ModelTimeout


async def test_a_reset_mid_stream_is_a_model_error_after_the_partial_text(make: MakeModel) -> None:
    events = [_event('{"choices": [{"delta": {"content": "Hel"}}]}'),
              _event('{"choices": [{"delta": {"content": "lo"}}]}')]
    async with sse_server(events, reset=True) as url:
        chunks, error = await _collect(make(url))
    assert chunks == ["Hel", "lo"]
    assert type(error) is ModelError and "partial" in str(error)


async def test_a_stream_cut_mid_way_is_a_model_error_after_the_partial_text(
    make: MakeModel, server: StubServer
) -> None:
    server.truncate_next(after_chunks=3)
    chunks, error = await _collect(make(server.url))
    assert chunks == ["Stu", "b a", "nsw"]
    assert type(error) is ModelError and "partial" in str(error)


# -- HTTP errors ----------------------------------------------------------------------------

@pytest.mark.parametrize(("status", "expected"), [(429, ModelUnavailable), (500, ModelUnavailable),
                                                  (503, ModelUnavailable), (404, ModelError)])
async def test_http_errors_map_alike(
    make: MakeModel, server: StubServer, status: int, expected: type[ModelError]
) -> None:
    model = make(server.url)
    server.fail_next(status)
    with pytest.raises(ModelError) as info:
        await model.complete(MESSAGES)
    assert type(info.value) is expected and str(status) in str(info.value)
    server.fail_next(status)
    chunks, error = await _collect(model)
    assert chunks == [] and type(error) is expected


async def test_retries_then_the_answer(make: MakeModel, server: StubServer) -> None:
    model = make(server.url, max_retries=1)
    server.fail_next(503)
    assert await model.complete(MESSAGES) == ANSWER
    server.fail_next(503)
    assert "".join((await _collect(model))[0]) == ANSWER
    assert len(server.chat_requests) == 4


# -- time -----------------------------------------------------------------------------------

async def test_a_silent_server_is_a_timeout(make: MakeModel, server: StubServer) -> None:
    model = make(server.url, timeout=0.3)
    server.hang_next(count=2)
    with pytest.raises(ModelTimeout):
        await model.complete(MESSAGES)
    chunks, error = await _collect(model)
    assert chunks == [] and type(error) is ModelTimeout


async def test_a_stream_stalling_mid_way_times_out_after_the_partial_text(
    make: MakeModel, server: StubServer
) -> None:
    server.chunk_delay = 1.0
    chunks, error = await _collect(make(server.url, timeout=0.3))
    assert chunks == ["Stu"] and type(error) is ModelTimeout


async def test_the_deadline_ends_a_slow_stream_cleanly_with_what_arrived(
    make: MakeModel, server: StubServer
) -> None:
    server.chunk_delay = 0.2
    model = make(server.url, deadline=0.7)
    chunks, error = await _collect(model)
    assert error is None and 1 <= len(chunks) < len(ANSWER) // 3
    assert ANSWER.startswith("".join(chunks)) and model.last_finish_reason == "length"


# -- which client ---------------------------------------------------------------------------

async def test_the_model_runs_on_aiohttp_by_default(server: StubServer) -> None:
    model = OpenAIChatModel(model="stub-model", base_url=server.url, max_retries=0,
                            options=OpenAIOptions(slots=0))
    try:
        assert model.transport == "aiohttp"
        assert "aiohttp" in type(model._client._client._transport).__module__
        assert "".join((await _collect(model))[0]) == ANSWER
    finally:
        await model.aclose()
    refused = OpenAIChatModel(model="stub-model", base_url=f"http://127.0.0.1:{_free_port()}/v1",
                              max_retries=0, options=OpenAIOptions(slots=0))
    try:
        with pytest.raises(ModelUnavailable):
            await refused.complete(MESSAGES)
    finally:
        await refused.aclose()


class _Unbuildable:
    def __init__(self, **_kwargs: object) -> None:
        raise RuntimeError("To use the aiohttp client you must have installed the package with the `aiohttp` extra")


@pytest.mark.parametrize("missing", ["unbuildable", "absent"])
async def test_without_aiohttp_the_model_falls_back_to_httpx(
    server: StubServer, monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    if missing == "absent":  # an SDK older than DefaultAioHttpClient
        monkeypatch.delattr(openai, "DefaultAioHttpClient")
    else:  # the SDK without its aiohttp extra
        monkeypatch.setattr(openai, "DefaultAioHttpClient", _Unbuildable)
    model = OpenAIChatModel(model="stub-model", base_url=server.url, max_retries=0,
                            options=OpenAIOptions(slots=0))
    try:
        assert model.transport == "httpx"
        assert "aiohttp" not in type(model._client._client._transport).__module__
        assert "".join((await _collect(model))[0]) == ANSWER
    finally:
        await model.aclose()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_client_passed_in_is_the_one_used(server: StubServer, transport: str) -> None:
    http: Any = openai.DefaultAioHttpClient() if transport == "aiohttp" else openai.DefaultAsyncHttpxClient()
    client = openai.AsyncOpenAI(api_key="mine", base_url=server.url, max_retries=0,
                                default_headers={"X-Mine": "1"}, http_client=http)
    model = OpenAIChatModel(model="stub-model", base_url="http://127.0.0.1:9/v1",
                            options=OpenAIOptions(client=client, slots=0))
    try:
        assert model._client is client and model.transport == transport
        assert "".join((await _collect(model))[0]) == ANSWER
        request = server.chat_requests[-1]
        assert request.headers["x-mine"] == "1" and request.headers["authorization"] == "Bearer mine"
    finally:
        await model.aclose()
    assert http.is_closed


async def test_closing_an_engine_closes_the_model_it_built(
    server: StubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from contextmode.api import build_engine
    from contextmode.store.memory import MemoryStore
    from contextmode.testing.counters import CharTokenCounter

    monkeypatch.setenv("CONTEXTMODE_LLM_MODEL", "stub-model")
    monkeypatch.setenv("CONTEXTMODE_LLM_BASE_URL", server.url)
    monkeypatch.setenv("CONTEXTMODE_LLM_SLOTS", "0")
    engine = build_engine(store=MemoryStore(), counter=CharTokenCounter())
    assert isinstance(engine.model, OpenAIChatModel)
    built = engine.model._client._client
    await engine.turn("t", "s", "你好")
    await engine.close()
    assert built.is_closed
    mine = OpenAIChatModel(model="stub-model", base_url=server.url, options=OpenAIOptions(slots=0))
    other = build_engine(store=MemoryStore(), model=mine, counter=CharTokenCounter())
    await other.close()
    try:
        assert not mine._client._client.is_closed  # a model passed in stays the caller's
    finally:
        await mine.aclose()
