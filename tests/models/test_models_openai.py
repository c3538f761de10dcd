"""`OpenAIChatModel`: the real openai client against the stub server over real HTTP."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest

pytest.importorskip("openai")

from contextmode.errors import ConfigError, ModelError, ModelTimeout, ModelUnavailable
from contextmode.models import ModelUsage, OpenAIChatModel, OpenAIOptions, map_openai_error
from contextmode.testing.models import collect_stream
from contextmode.testing.stub_server import StubServer
from contextmode.types import ChatMessage

SECRET = "sk-test-0123456789abcdefSECRET"
MESSAGES = [
    ChatMessage(role="system", content="你是客服助手。"),
    ChatMessage(role="user", content="空调制冷差怎么办?"),
]


@pytest.fixture
async def model(server: StubServer) -> AsyncIterator[OpenAIChatModel]:
    chat_model = OpenAIChatModel(
        model="stub-model", base_url=server.url, api_key=SECRET, timeout=2, max_retries=0,
        options=OpenAIOptions(extra_headers={"X-Trace": "t-1"}),
    )
    yield chat_model
    await chat_model.aclose()


async def _collect(model: OpenAIChatModel) -> tuple[list[str], ModelError | None]:
    return await collect_stream(model, MESSAGES)


async def test_complete_returns_the_answer_and_usage(model: OpenAIChatModel, server: StubServer) -> None:
    assert await model.complete(MESSAGES, max_tokens=50) == "Stub answer to: 空调制冷差怎么办?"
    request = server.chat_requests[-1]
    assert request.body["model"] == "stub-model"
    assert request.body["max_tokens"] == 50
    assert request.body["messages"][0] == {"role": "system", "content": "你是客服助手。"}
    assert request.headers["authorization"] == f"Bearer {SECRET}"
    assert request.headers["x-trace"] == "t-1"
    assert isinstance(model.last_usage, ModelUsage) and model.last_usage.completion_tokens > 0


async def test_stream_yields_deltas_and_captures_usage(server: StubServer) -> None:
    usages: list[ModelUsage] = []
    model = OpenAIChatModel(model="stub-model", base_url=server.url, max_retries=0, on_usage=usages.append)
    chunks, error = await _collect(model)
    assert error is None
    assert len(chunks) > 3
    assert "".join(chunks) == "Stub answer to: 空调制冷差怎么办?"
    assert server.chat_requests[-1].body["stream_options"] == {"include_usage": True}
    assert usages and usages[-1].prompt_tokens > 0


async def test_a_400_on_stream_options_retries_without_them(server: StubServer, model: OpenAIChatModel) -> None:
    server.fail_next(400)
    chunks, error = await _collect(model)
    assert error is None and "".join(chunks).startswith("Stub answer")
    first, second = server.chat_requests[-2:]
    assert "stream_options" in first.body and "stream_options" not in second.body
    chunks, error = await _collect(model)  # remembered: no second refusal needed
    assert "stream_options" not in server.chat_requests[-1].body


async def test_newer_openai_models_get_max_completion_tokens(server: StubServer, model: OpenAIChatModel) -> None:
    server.fail_next(400, message="Unsupported parameter: 'max_tokens'. Use 'max_completion_tokens' instead.")
    assert (await model.complete(MESSAGES, max_tokens=20)).startswith("Stub answer")
    refused, accepted = server.chat_requests
    assert refused.body["max_tokens"] == 20 and "max_tokens" not in accepted.body
    assert accepted.body["max_completion_tokens"] == 20
    await model.complete(MESSAGES, max_tokens=30)
    assert server.chat_requests[-1].body["max_completion_tokens"] == 30  # remembered
    assert len(server.chat_requests) == 3


@pytest.mark.parametrize(("status", "error"), [(429, ModelUnavailable), (500, ModelUnavailable),
                                               (503, ModelUnavailable), (404, ModelError)])
async def test_http_errors_map_to_the_error_tree(
    server: StubServer, model: OpenAIChatModel, status: int, error: type[ModelError]
) -> None:
    server.fail_next(status)
    with pytest.raises(error) as info:
        await model.complete(MESSAGES)
    assert type(info.value) is error
    assert str(status) in str(info.value)
    server.fail_next(status)
    chunks, streamed_error = await _collect(model)
    assert chunks == [] and type(streamed_error) is error


async def test_the_client_retries_before_giving_up(server: StubServer) -> None:
    model = OpenAIChatModel(model="stub-model", base_url=server.url, max_retries=1)
    server.fail_next(503)
    assert (await model.complete(MESSAGES)).startswith("Stub answer")
    server.fail_next(429, count=2)
    with pytest.raises(ModelUnavailable):
        await model.complete(MESSAGES)
    assert len(server.chat_requests) == 4


async def test_a_hanging_server_raises_model_timeout(server: StubServer) -> None:
    model = OpenAIChatModel(model="stub-model", base_url=server.url, timeout=0.3, max_retries=0)
    server.hang_next(count=2)
    with pytest.raises(ModelTimeout):
        await model.complete(MESSAGES)
    chunks, error = await _collect(model)
    assert chunks == [] and isinstance(error, ModelTimeout)


async def test_a_stream_stalling_mid_way_times_out_after_the_partial_text(server: StubServer) -> None:
    server.chunk_delay = 1.0
    model = OpenAIChatModel(model="stub-model", base_url=server.url, timeout=0.3, max_retries=0)
    chunks, error = await _collect(model)
    assert chunks == ["Stu"] and isinstance(error, ModelTimeout)


async def test_a_truncated_stream_yields_the_partial_text_then_raises(server: StubServer, model: OpenAIChatModel) -> None:
    server.truncate_next(after_chunks=3)
    chunks, error = await _collect(model)
    assert chunks == ["Stu", "b a", "nsw"]
    assert type(error) is ModelError and "partial" in str(error)


async def test_a_stream_that_ends_without_finish_reason_is_partial(
    server: StubServer, model: OpenAIChatModel
) -> None:
    server.unfinished_next()
    chunks, error = await _collect(model)
    assert "".join(chunks) == "Stub answer to: 空调制冷差怎么办?"
    assert type(error) is ModelError and "finish_reason" in str(error)


async def test_malformed_responses_are_model_errors(server: StubServer, model: OpenAIChatModel) -> None:
    server.malformed_next()
    with pytest.raises(ModelError):
        await model.complete(MESSAGES)
    server.malformed_next()
    chunks, error = await _collect(model)
    assert chunks == ["Stu"] and type(error) is ModelError


async def test_connection_resets_and_refused_connections_are_unavailable(
    server: StubServer, model: OpenAIChatModel
) -> None:
    server.reset_next()
    with pytest.raises(ModelUnavailable):
        await model.complete(MESSAGES)
    closed = OpenAIChatModel(model="m", base_url="http://127.0.0.1:9/v1", max_retries=0, timeout=1)
    with pytest.raises(ModelUnavailable):
        await closed.complete(MESSAGES)


async def test_the_api_key_never_shows(server: StubServer, model: OpenAIChatModel,
                                       caplog: pytest.LogCaptureFixture) -> None:
    assert SECRET not in repr(model)
    server.fail_next(401)
    with caplog.at_level(logging.DEBUG), pytest.raises(ModelError) as info:
        await model.complete(MESSAGES)
    assert SECRET not in str(info.value)
    assert SECRET not in caplog.text

    class Echoing(Exception):
        pass

    mapped = map_openai_error(Echoing(f"Incorrect API key provided: {SECRET}"), secret=SECRET)
    assert SECRET not in str(mapped)
    assert "sk-" not in str(map_openai_error(Echoing("bad key sk-abcdefghijklmnop1234")))


async def test_model_requests_guard_blocks_non_loopback_urls(
    monkeypatch: pytest.MonkeyPatch, server: StubServer, model: OpenAIChatModel
) -> None:
    monkeypatch.setenv("CONTEXTMODE_ALLOW_MODEL_REQUESTS", "0")
    remote = OpenAIChatModel(model="gpt-4o-mini", base_url="https://api.example.com/v1", api_key=SECRET)
    with pytest.raises(ConfigError, match="CONTEXTMODE_ALLOW_MODEL_REQUESTS"):
        await remote.complete(MESSAGES)
    with pytest.raises(ConfigError):
        async for _ in remote.stream(MESSAGES):
            pass
    default = OpenAIChatModel(model="gpt-4o-mini", api_key=SECRET)
    with pytest.raises(ConfigError):
        await default.complete(MESSAGES)
    assert (await model.complete(MESSAGES)).startswith("Stub answer")  # loopback stays allowed


def test_missing_api_key_for_openai_itself_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="CONTEXTMODE_LLM_API_KEY"):
        OpenAIChatModel(model="gpt-4o-mini")


def test_a_key_from_openai_api_key_is_hidden_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    model = OpenAIChatModel(model="gpt-4o-mini")
    assert SECRET not in repr(model)

    class Echoing(Exception):
        pass

    assert SECRET not in str(model._map(Echoing(f"key {SECRET} rejected")))


async def test_a_length_cut_answer_is_complete_not_broken(model: OpenAIChatModel) -> None:
    chunks, error = await _collect_with(model, max_tokens=2)
    assert error is None and "".join(chunks) == "Stub answer"


async def _collect_with(model: OpenAIChatModel, **kwargs: int) -> tuple[list[str], BaseException | None]:
    chunks: list[str] = []
    try:
        async for chunk in model.stream(MESSAGES, **kwargs):
            chunks.append(chunk)
    except ModelError as exc:
        return chunks, exc
    return chunks, None


def _sse_model(body: bytes, *, piece: int = 0) -> OpenAIChatModel:
    """A model whose endpoint answers every streamed call with ``body`` (SSE), in process
    (sent ``piece`` bytes at a time when given)."""
    import importlib

    import openai

    # The HTTP library the installed SDK is built on (httpx, or httpx2 for openai ≥ 3).
    http = importlib.import_module(openai.DefaultAsyncHttpxClient.__mro__[1].__module__.split(".")[0])

    async def pieces() -> AsyncIterator[bytes]:
        for start in range(0, len(body), piece):
            yield body[start:start + piece]

    def answer(request: object) -> object:
        return http.Response(200, headers={"content-type": "text/event-stream"},
                             content=pieces() if piece else body)

    client = openai.AsyncOpenAI(
        api_key=SECRET, base_url="http://127.0.0.1:9/v1", max_retries=0,
        http_client=openai.DefaultAsyncHttpxClient(transport=http.MockTransport(answer)),
    )
    return OpenAIChatModel(
        model="m", base_url="http://127.0.0.1:9/v1", options=OpenAIOptions(client=client, slots=0)
    )


async def test_the_stream_is_read_as_server_sent_events() -> None:
    # Comments, event/id fields, a data field split over two lines, "data:" without its
    # space, CRLF line ends, and bytes after [DONE] (never read as a chunk).
    body = (
        b': keep-alive\n\n'
        b'event: message\nid: 1\ndata: {"choices": [{"delta": {"content": "Hel"}}]}\n\n'
        b'data: {"choices": [{"delta":\ndata: {"content": "lo"}}]}\n\n'
        b'data:{"choices": [{"delta": {}, "finish_reason": "stop"}]}\r\n\r\n'
        b'data: {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2}}\n\n'
        b'data: [DONE]\n\ndata: {"choices": [{"delta": {"content": "never"}}]}\n\n'
    )
    model = _sse_model(body)
    chunks, error = await _collect(model)
    assert (chunks, error) == (["Hel", "lo"], None)
    assert model.last_finish_reason == "stop"
    assert model.last_usage == ModelUsage(prompt_tokens=7, completion_tokens=2)


async def test_sse_lines_end_only_at_cr_or_lf_whatever_the_pieces_the_body_arrives_in() -> None:
    # Raw U+2028, U+0085 and a form feed inside the JSON text (valid JSON, no line end in SSE),
    # CR, LF and CRLF line ends, and multi-byte characters, cut every 1, 2, 3 and 7 bytes.
    import json

    texts = ["第一\u2028段", "a\x85b", "c\x0cd", "é🙂"]
    ends = ["\n\n", "\r\r", "\r\n\r\n", "\n\r\n"]
    body = "".join(
        "data: " + json.dumps({"choices": [{"delta": {"content": t}}]}, ensure_ascii=False) + end
        for t, end in zip(texts, ends, strict=True)
    ) + 'data: {"choices": [{"delta": {}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'
    for piece in (1, 2, 3, 7):
        chunks, error = await _collect(_sse_model(body.encode(), piece=piece))
        assert (chunks, error) == (texts, None), piece


async def test_an_error_event_in_the_stream_is_a_model_error_after_the_partial_text() -> None:
    body = (
        b'data: {"choices": [{"delta": {"content": "Hel"}}]}\n\n'
        b'data: {"error": {"message": "the server ran out of memory"}}\n\n'
    )
    chunks, error = await _collect(_sse_model(body))
    assert chunks == ["Hel"]
    assert type(error) is ModelError and "partial" in str(error) and "out of memory" in str(error)
