"""`OpenAIChatModel`: any OpenAI-compatible chat-completions endpoint through the official client.

Works with OpenAI, DeepSeek, Qwen (DashScope compatible mode), vLLM, Ollama and
the llama.cpp server (see docs/models.md). Provider errors are translated to
`contextmode.errors` in one place, `map_openai_error`; the API key never
appears in a ``repr``, an error message or a log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import (
    ConfigError,
    MissingExtra,
    ModelDeferred,
    ModelError,
    ModelOverloaded,
    ModelPreempted,
    ModelRateLimited,
    ModelRefused,
    ModelTimeout,
    ModelUnavailable,
)
from ..text.degenerate import is_looping
from ..types import ChatMessage
from .base import (
    JsonSchema,
    ModelEvent,
    Relay,
    TextDelta,
    ToolCallDelta,
    ToolChoice,
    ToolSpec,
    UpstreamReply,
)
from .caching import ModelUsage, current_cache_key, report_usage, usage_from
from .calls import CallMeter, call_log, estimate_prompt
from .priority import Cuttable, SlotGate, call_priority, endpoint_gate, paused_limits
from .server import ServerInfo, probe_server
from .settings import LLMSettings, ResponseFormatMode, check_model_request_allowed

if TYPE_CHECKING:
    from openai import AsyncOpenAI

__all__ = [
    "ModelUsage",
    "OpenAIChatModel",
    "OpenAIOptions",
    "alternating",
    "json_complete",
    "map_openai_error",
    "retry_after_s",
    "wire_message",
]

logger = logging.getLogger("contextmode.models.openai")

_KEY_LIKE = re.compile(r"\b(sk|pk|key|api[-_]?key)-[A-Za-z0-9_\-]{8,}", re.I)
_OPENAI_ENDPOINT = "https://api.openai.com/v1"
_NO_KEY = "not-needed"  # local servers (Ollama, vLLM, llama.cpp) ignore the key but the client wants one
_RAW_RESPONSE_HEADER = "X-Stainless-Raw-Response"
"""The SDK's own switch behind ``with_streaming_response``: ``stream`` returns the response unread."""
_CACHE_HINTS = ("prompt_cache_key", "cache_prompt")
"""Request fields `OpenAIChatModel._cache_hints` adds; dropped for an endpoint that refuses them."""
_DRAIN_S = 1.0
"""How long the body after ``data: [DONE]`` is read for connection reuse before it is dropped."""


_LOOP_CHECK_CHARS = 32
"""A streamed reply is checked for a loop every this many new characters."""
_BLANK_CHUNKS = 128
"""Chunks in a row with nothing visible (blanks, empty pieces) after which a stream is stopped:
a small model can pad a reply with blanks up to its token cap."""


def _scrub(text: str, secret: str | None) -> str:
    if secret and secret != _NO_KEY:
        text = text.replace(secret, "***")
    return _KEY_LIKE.sub("***", text)


def map_openai_error(
    exc: BaseException, *, secret: str | None = None, mid_stream: bool = False, relayed: bool = False
) -> ModelError:
    """Translate an openai/httpx exception into the `ModelError` tree (the one place this happens).

    ``APITimeoutError`` and transport timeouts → `ModelTimeout`; 429, 5xx and
    connection failures → `ModelUnavailable`; anything else (4xx, malformed
    responses) → `ModelError`. With ``mid_stream`` (the answer had started) a
    non-timeout failure is a plain `ModelError`: the stream broke, the partial
    answer stands. ``secret`` is scrubbed from the message, as is anything
    shaped like an API key. With ``relayed`` (a client's own request, `OpenAIChatModel.relay`)
    the status keeps its meaning for the client: 429 → `ModelRateLimited` and 529 →
    `ModelOverloaded` (with the endpoint's wait), 400/404/413/422 → `ModelRefused`.
    """
    import openai

    detail = _scrub(f"{type(exc).__name__}: {exc}", secret)
    if _connection_failure(exc):
        # Over aiohttp the SDK reports a refused or reset connection as APITimeoutError
        # (or a bare transport error): what aiohttp raised, behind it, says what happened.
        if mid_stream:
            return ModelError(f"the model's stream broke before the end; the answer is partial ({detail})")
        return ModelUnavailable(f"could not reach the model endpoint ({detail})")
    if isinstance(exc, openai.APITimeoutError) or "Timeout" in type(exc).__name__:
        return ModelTimeout(f"the model did not answer in time ({detail})")
    if mid_stream:
        return ModelError(f"the model's stream broke before the end; the answer is partial ({detail})")
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        if relayed and (kept := _relayed_status(exc, detail)) is not None:
            return kept
        if status == 429 or status >= 500:
            return ModelUnavailable(f"the model endpoint answered HTTP {status} ({detail})")
        return ModelError(f"the model endpoint refused the request with HTTP {status} ({detail})")
    if isinstance(exc, openai.APIConnectionError):
        return ModelUnavailable(f"could not reach the model endpoint ({detail})")
    return ModelError(f"the model call failed ({detail})")


def _relayed_status(exc: Any, detail: str) -> ModelError | None:
    """The error a relayed request's status means to the client, or ``None`` (then a 5xx is
    `ModelUnavailable` and any other status a `ModelError`, as for the engine's own calls)."""
    status = int(exc.status_code)
    if status in (429, 529):
        wait = retry_after_s(exc.response.headers)
        if status == 529:
            return ModelOverloaded(f"the model endpoint is overloaded ({detail})", retry_after=wait)
        return ModelRateLimited(f"the model endpoint is rate limiting ({detail})", retry_after=wait)
    if status in (400, 404, 413, 422):
        return ModelRefused(f"the model endpoint refused the request with HTTP {status} ({detail})", status=status)
    return None


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    """Seconds a response asks to wait: its ``retry-after-ms``, else its ``retry-after`` in
    seconds (an HTTP date is not read); ``None`` when it names none."""
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) * scale
        except ValueError:
            continue
        if seconds >= 0:
            return seconds
    return None


_PASSED_HEADERS = ("x-request-id", "request-id", "openai-processing-ms")
"""An endpoint's response headers a relayed reply passes on to the client."""


_AIOHTTP_CONNECTION_ERRORS = ("ClientConnectorError", "ServerDisconnectedError", "ClientOSError")
"""aiohttp's errors for a connection refused, reset or closed by the server (every subclass
of them too: `ClientConnectorError` is a `ClientOSError`; the DNS, proxy and certificate errors
are `ClientConnectorError` s)."""


def _connection_failure(exc: BaseException) -> bool:
    """True when ``exc`` is, or was raised from (``__cause__`` / ``__context__``), aiohttp's
    error for a connection that could not be made or was lost (`_AIOHTTP_CONNECTION_ERRORS`)
    and not a timeout.

    The SDK's aiohttp transport maps aiohttp's connection errors to httpx's ``ConnectTimeout``
    (its mapping table matches their base class first; openai-python PR #3594), so the SDK
    raises ``APITimeoutError`` for a refused connection and a reset mid-stream is a
    "timeout" too. Over httpx the chain holds no aiohttp error and nothing changes."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for cls in type(current).__mro__:
            if cls.__name__ in _AIOHTTP_CONNECTION_ERRORS and cls.__module__.startswith("aiohttp"):
                return not isinstance(current, TimeoutError)
        current = current.__cause__ or current.__context__
    return False


def _aiohttp_client(openai: Any) -> Any:
    """The SDK's aiohttp-based HTTP client (``DefaultAioHttpClient``, the ``openai[aiohttp]``
    extra), or ``None`` when it cannot be built: the SDK then builds its own httpx client.

    aiohttp parses HTTP in C; httpx's h11 in Python: a streamed reply costs the worker about a
    third less CPU over aiohttp (benchmarks/bench_model_call.py)."""
    factory = getattr(openai, "DefaultAioHttpClient", None)  # older SDKs have none
    if factory is None:
        return None
    try:
        return factory()
    except (ImportError, RuntimeError) as exc:  # the SDK's "install the aiohttp extra" error
        logger.debug("aiohttp client unavailable, the SDK's httpx client is used: %s", exc)
        return None


def _transport_of(client: object) -> str:
    """``aiohttp`` or ``httpx``: what an ``AsyncOpenAI`` client sends its requests with."""
    http = getattr(client, "_client", None)
    for obj in (http, getattr(http, "_transport", None)):
        if obj is not None and any("aiohttp" in cls.__module__ for cls in type(obj).__mro__):
            return "aiohttp"
    return "httpx"


def _import_openai() -> Any:
    try:
        import openai
    except ImportError as exc:
        raise MissingExtra("openai", "openai") from exc
    return openai


@dataclass(frozen=True, kw_only=True)
class OpenAIOptions:
    """How `OpenAIChatModel` calls its endpoint, beyond the model, address, key, timeout and retries."""

    extra_headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    """HTTP headers sent with every request (they may hold secrets, so not in ``repr``)."""
    temperature: float | None = None
    """Sampling temperature; ``None`` leaves the server default."""
    include_usage: bool = True
    """Ask for usage on streams (dropped automatically if the server refuses it)."""
    reply_max_tokens: int | None = 1024
    """``max_tokens`` of a reply when the caller names none; ``None`` = no cap."""
    deadline: float | None = 120.0
    """Wall-clock seconds one call may take in all; ``None`` = none."""
    response_format: ResponseFormatMode = "auto"
    """Structured-output wire format; ``auto`` probes the server on first use."""
    slots: int | None = None
    """Requests the endpoint answers at once: ``None`` = as the server says (probed on first
    use), ``0`` = no limit. With a limit, replies go before background calls (`models.priority`)."""
    background_wait_s: float | None = 30.0
    """Seconds a background call waits for a free slot before it gives up; ``None`` = no limit."""
    valid_text: bool = True
    """Ask a server that stalls on broken text for valid UTF-8 (`VALID_TEXT`) in text calls
    written in a script of multi-byte characters (`ServerInfo.stalls_on_broken_text`)."""
    server_info: ServerInfo | None = None
    """What the server is, when known: skips the probe."""
    client: AsyncOpenAI | None = None
    """An ``AsyncOpenAI`` client to use instead of building one (its own address, key,
    timeout and retries then apply)."""
    prompt_cache_key: bool | None = None
    """Send OpenAI's ``prompt_cache_key`` (one per session) with a session's requests: ``None``
    = only to OpenAI's own endpoint (``https://api.openai.com/v1``); a llama.cpp server gets
    ``cache_prompt`` instead (docs/caching.md)."""


class OpenAIChatModel:
    """A `ChatModel` over ``AsyncOpenAI``'s ``chat.completions.create``.

    ``stream()`` yields text deltas; if the stream breaks or ends without a
    ``finish_reason`` it raises `ModelError` *after* yielding what arrived, so
    the caller can keep a partial answer. Every call is bounded: a
    reply gets ``reply_max_tokens`` when the caller names no ``max_tokens``, and
    a call past ``deadline`` seconds, or a reply that loops (`is_looping`),
    stops cleanly with what arrived, ``last_finish_reason`` ``length``.

    ``complete_json`` asks for JSON fitting a schema in the server's own wire
    format (``response_format``): ``json_schema`` for OpenAI and vLLM,
    ``json_object`` with a ``schema`` for llama.cpp, found by `probe_server`
    on first use (``auto``), and adapted once if the server refuses it.

    On an endpoint with a slot limit (``slots``, or the server's, see `ServerInfo.slots`) every
    call first takes a slot from the endpoint's `PriorityGate`: replies before the calls of
    background jobs (`models.priority`).
    """

    def __init__(
        self,
        *,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 2,
        on_usage: Callable[[ModelUsage], None] | None = None,
        options: OpenAIOptions | None = None,
    ) -> None:
        """``timeout`` in seconds (connect and each read); ``on_usage`` receives each call's usage;
        ``options`` the rest (`OpenAIOptions`: headers, temperature, reply cap, deadline…)."""
        openai = _import_openai()
        options = options or OpenAIOptions()
        self.name = model
        self.base_url = base_url
        self.reply_max_tokens, self.deadline = options.reply_max_tokens, options.deadline
        self.last_finish_reason: str | None = None
        """How the most recent stream ended (``stop``, ``length``…; racy under concurrency)."""
        self._format: ResponseFormatMode = options.response_format
        self._slots, self._background_wait = options.slots, options.background_wait_s
        self._server_info = options.server_info
        self._valid_text = options.valid_text
        self._extra_headers = dict(options.extra_headers)
        self.temperature = options.temperature
        self.on_usage = on_usage
        self.last_usage: ModelUsage | None = None
        """Usage of the most recent call that reported one (for logs; racy under concurrency)."""
        self._include_usage = options.include_usage
        self._send_cache_hints = True
        self._merge_roles = False
        """Learnt from a refusal (`_refuses_alternation`): consecutive messages of one role are
        sent as one (a chat template that demands user/assistant alternation)."""
        self._cache_key_option = options.prompt_cache_key
        self._length_param = "max_tokens"
        self._secret = api_key
        client = options.client
        if client is None:
            try:
                client = openai.AsyncOpenAI(
                    api_key=api_key or (_NO_KEY if base_url else None),
                    base_url=base_url,
                    timeout=timeout,
                    max_retries=max_retries,
                    default_headers=dict(options.extra_headers),
                    http_client=_aiohttp_client(openai),
                )
            except openai.OpenAIError as exc:  # e.g. no key at all for api.openai.com
                raise ConfigError(
                    _scrub(f"cannot configure the OpenAI client: {exc}", api_key)
                    + " (set CONTEXTMODE_LLM_API_KEY)"
                ) from None
        self._client = client
        self.transport = _transport_of(client)
        """The HTTP client under the SDK: ``aiohttp`` (the default when the ``openai[aiohttp]``
        extra is installed) or ``httpx``."""
        resolved = getattr(client, "api_key", None)  # OPENAI_API_KEY when no key was passed
        if isinstance(resolved, str) and resolved and not self._secret:
            self._secret = resolved

    @classmethod
    def from_settings(
        cls,
        settings: LLMSettings,
        *,
        on_usage: Callable[[ModelUsage], None] | None = None,
        client: AsyncOpenAI | None = None,
    ) -> OpenAIChatModel:
        """Build from `LLMSettings` (for other values, ``dataclasses.replace`` the settings first)."""
        if not settings.model:
            raise ConfigError("CONTEXTMODE_LLM_MODEL is not set")
        return cls(
            model=settings.model,
            base_url=settings.base_url,
            api_key=settings.api_key,
            timeout=settings.timeout,
            max_retries=settings.max_retries,
            on_usage=on_usage,
            options=OpenAIOptions(
                extra_headers=settings.extra_headers,
                temperature=settings.temperature,
                reply_max_tokens=settings.reply_max_tokens,
                deadline=settings.deadline,
                response_format=settings.response_format,
                slots=settings.slots,
                background_wait_s=settings.background_wait_s,
                valid_text=settings.valid_text,
                client=client,
            ),
        )

    def __repr__(self) -> str:
        key = "***" if self._secret else None
        return f"OpenAIChatModel(name={self.name!r}, base_url={self.base_url!r}, api_key={key!r})"

    def server_info(self) -> ServerInfo:
        """What the server says about itself (probed once, synchronously; see `probe_server`)."""
        if self._server_info is None:
            self._server_info = probe_server(self.base_url, self.name, headers=self._extra_headers)
        return self._server_info

    async def slot_gate(self) -> SlotGate | None:
        """The gate this model's calls pass (shared by every model on the same endpoint in this
        event loop), or ``None`` when the endpoint has no known slot limit."""
        if self._slots is None:
            info = self._server_info if self._server_info is not None else await asyncio.to_thread(self.server_info)
            self._slots = info.slots or 0
        return endpoint_gate(self.base_url or _OPENAI_ENDPOINT, self._slots)

    @asynccontextmanager
    async def _slot(self, deadline: float | None) -> AsyncIterator[CallMeter]:
        """Hold one of the endpoint's slots (replies first, see `models.priority`) while a call
        runs; a reply's wait counts in its deadline. The call is logged (`models.calls`), and a
        background call a reply cuts short raises `ModelPreempted`."""
        meter = call_log().start()
        gate = await self.slot_gate()
        priority = meter.priority
        if gate is not None:
            await self._acquire(gate, meter, deadline)
        meter.admit()
        cut = Cuttable() if gate is not None and priority == "background" else None
        if cut is not None and gate is not None:
            gate.hold(cut)
            cut.inside = True
        try:
            yield meter
        except asyncio.CancelledError:
            if cut is None or not cut.preempted:
                meter.end("cancelled")
                raise
            task = asyncio.current_task()
            if task is not None and task.uncancel() > 0:
                meter.end("cancelled")
                raise  # cancelled for another reason too (shutdown): that one stands
            meter.end("preempted")
            raise ModelPreempted("a reply needed the model's slot; this background call was cut short") from None
        except GeneratorExit:
            meter.end("closed by the caller")
            raise
        except BaseException as exc:
            meter.end(f"error: {type(exc).__name__}")
            raise
        else:
            meter.end(meter.outcome if meter.outcome != "running" else (self.last_finish_reason or "stop"))
        finally:
            if gate is not None:
                if cut is not None:
                    cut.inside = False
                    gate.unhold(cut)
                gate.release(priority)

    async def _acquire(self, gate: SlotGate, meter: CallMeter, deadline: float | None) -> None:
        """Take a slot: a reply within its deadline; a background call for up to
        ``background_wait_s`` (then `ModelDeferred`), with the time limits around it paused
        meanwhile (its wait is a deferral, not time it took: `models.priority.paused_limits`)."""
        priority = meter.priority
        try:
            if priority == "background":
                with paused_limits():
                    await gate.acquire(priority, wait_s=self._background_wait)
                return
            async with asyncio.timeout_at(deadline):
                await gate.acquire(priority, wait_s=self._background_wait)
        except TimeoutError:
            meter.end("error: no free slot")
            raise ModelTimeout(f"no free model slot within the {self.deadline} s deadline") from None
        except ModelDeferred:
            meter.end("deferred: no free slot")
            raise
        except BaseException as exc:
            meter.end(f"error: {type(exc).__name__}")
            raise

    def _call_deadline(self, meter: CallMeter) -> float | None:
        """The loop time a call must end by: ``deadline`` seconds from when a background call was
        admitted (its wait for a slot does not count), from when a reply call asked for one."""
        if self.deadline is None:
            return None
        start = meter.admitted if meter.priority == "background" and meter.admitted is not None else meter.asked
        return asyncio.get_running_loop().time() - (time.monotonic() - start) + self.deadline

    def _valid(self, request: dict[str, Any]) -> dict[str, Any]:
        """``request`` asking for valid UTF-8 (`VALID_TEXT`) when the server stalls on broken text
        (`ServerInfo.stalls_on_broken_text`), the call asks for text (no grammar, response format
        or tools of its own) and a message holds multi-byte characters (a 3-byte UTF-8 script:
        Chinese, Japanese, Korean…). Measured on SmolLM2-135M behind llama-cpp-python (docs/models.md):
        3 of 6 Chinese replies of 600 tokens stalled for ~40 s without it, none with it; a token
        costs about a third more with it."""
        info = self._server_info
        if (not self._valid_text or info is None or not info.stalls_on_broken_text
                or any(k in request for k in ("grammar", "response_format", "tools"))):
            return request
        if not any(isinstance(c := m.get("content"), str) and _MULTI_BYTE.search(c)
                   for m in request.get("messages") or () if isinstance(m, Mapping)):
            return request
        return {**request, "grammar": VALID_TEXT}

    def _request(self, messages: Sequence[ChatMessage], max_tokens: int | None) -> dict[str, Any]:
        check_model_request_allowed(self.base_url)
        wired = [wire_message(m) for m in messages]
        request: dict[str, Any] = {
            "model": self.name,
            "messages": alternating(wired) if self._merge_roles else wired,
        }
        if max_tokens is not None:
            request["max_tokens"] = max_tokens
        if self.temperature is not None:
            request["temperature"] = self.temperature
        request.update(self._cache_hints())
        return request

    def _cache_hints(self) -> dict[str, Any]:
        """What tells the endpoint to reuse its prompt cache for this session's requests
        (`models.caching.cache_session`): ``cache_prompt`` for a llama.cpp server, OpenAI's
        ``prompt_cache_key`` for OpenAI's own endpoint (other servers cache a shared prefix by
        themselves and may refuse a field they do not know); nothing outside a session, or once
        the endpoint refused them."""
        key = current_cache_key()
        if key is None or not self._send_cache_hints:
            return {}
        if self._server_info is not None and self._server_info.kind == "llamacpp":
            return {"cache_prompt": True}
        official = (self.base_url or _OPENAI_ENDPOINT).rstrip("/").startswith(_OPENAI_ENDPOINT)
        wanted = official if self._cache_key_option is None else self._cache_key_option
        return {"prompt_cache_key": key} if wanted else {}

    def _record_usage(self, usage: Any, timings: Any = None) -> None:
        record = usage_from(usage, timings)
        if record is None:
            return
        report_usage(record)
        self.last_usage = record
        if self.on_usage is not None:
            self.on_usage(record)
        logger.debug("model %s usage: %s", self.name, record)

    async def complete(self, messages: Sequence[ChatMessage], *, max_tokens: int | None = None) -> str:
        """The whole answer at once (non-streaming request)."""
        return await self._complete(self._request(messages, max_tokens))

    async def complete_json(
        self, messages: Sequence[ChatMessage], *, schema: JsonSchema, max_tokens: int | None = None
    ) -> str:
        """The whole answer, asked on the wire to fit ``schema`` (the caller still validates it)."""
        if self._format == "auto":
            self._format = (await asyncio.to_thread(self.server_info)).response_format
        request = self._request(messages, max_tokens)
        if self._format == "json_schema":
            request["response_format"] = {
                "type": "json_schema", "json_schema": {"name": schema.name, "schema": dict(schema.schema)},
            }
        elif self._format == "json_object":
            request["response_format"] = {"type": "json_object", "schema": dict(schema.schema)}
        return await self._complete(request)

    async def _complete(self, request: dict[str, Any]) -> str:
        if call_priority() == "background" or (self._server_info is not None and self._server_info.kind == "llamacpp"):
            # Sent as a stream: a server finishes a non-streamed request even after the client
            # gave up (llama-cpp-python notices a client gone only as it sends a chunk), and
            # stops a stream within a token once its connection closes. So a background call
            # cut short for a reply, or abandoned at its timeout, frees the server at once.
            return "".join([e.text async for e in self._stream_request(request) if e.kind == "text"])
        loop = asyncio.get_running_loop()
        deadline = None if self.deadline is None else loop.time() + self.deadline
        try:
            async with self._slot(deadline) as meter, asyncio.timeout_at(call_deadline := self._call_deadline(meter)):
                completion = await self._create(_sized_in_time(request, meter, call_deadline, "max_tokens"), stream=False)
                _meter_chunk(meter, {"usage": _field(completion, "usage")})
        except TimeoutError:
            raise ModelTimeout(f"the model did not answer within the {self.deadline} s deadline") from None
        try:
            text = completion.choices[0].message.content or ""
        except (AttributeError, IndexError, TypeError) as exc:
            raise ModelError(f"the model endpoint sent a completion without a message ({exc})") from exc
        self._record_usage(getattr(completion, "usage", None))
        return text

    async def stream(
        self, messages: Sequence[ChatMessage], *, max_tokens: int | None = None
    ) -> AsyncIterator[str]:
        """Yield text deltas as they arrive; raise `ModelError` subclasses on failure."""
        events = self.stream_events(messages, max_tokens=max_tokens)
        try:
            async for event in events:
                if event.kind == "text":
                    yield event.text
        finally:  # a caller that stops reading closes the request now, not when it is collected
            if isinstance(events, AsyncGenerator):
                await events.aclose()

    async def stream_events(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[ToolSpec] = (),
        tool_choice: ToolChoice | None = None,
        max_tokens: int | None = None,
    ) -> AsyncIterator[ModelEvent]:
        """Text and tool-call deltas as they arrive (``tools`` offered when given), bounded
        like `stream`; raise `ModelError` subclasses on failure, including a stream that ends
        before its finish_reason."""
        request = self._request(messages, self.reply_max_tokens if max_tokens is None else max_tokens)
        if tools:
            request["tools"] = [dict(t) for t in tools]
        if tool_choice is not None:
            request["tool_choice"] = tool_choice if isinstance(tool_choice, str) else dict(tool_choice)
        events = self._stream_request(request)
        try:
            async for event in events:
                yield event
        finally:
            if isinstance(events, AsyncGenerator):
                await events.aclose()

    async def relay(
        self, messages: Sequence[ChatMessage] | None, relay: Relay, *, max_tokens: int | None = None
    ) -> AsyncIterator[ModelEvent | UpstreamReply]:
        """Send a client's own request (`RelayingModel.relay`): its fields unchanged, but
        ``model`` (this model's), ``stream`` (``relay.stream``), ``messages`` (when given) and
        the length cap (the smallest of the client's, ``max_tokens`` and, when the client names
        none, ``reply_max_tokens``, sent under the client's own name for it). One attempt: a
        client SDK retries by itself, and the status it sees keeps its meaning
        (`map_openai_error` with ``relayed``)."""
        request = self._relay_request(messages, relay, max_tokens)
        loop = asyncio.get_running_loop()
        deadline = None if self.deadline is None else loop.time() + self.deadline
        async with self._slot(deadline) as meter:
            request = self._valid(_sized_in_time(request, meter, deadline, self._length_param))
            events = self._relay_stream(request, deadline) if relay.stream else self._relay_whole(request, deadline)
            async with aclosing(events):
                async for event in events:
                    yield event

    def _relay_request(
        self, messages: Sequence[ChatMessage] | None, relay: Relay, max_tokens: int | None
    ) -> dict[str, Any]:
        check_model_request_allowed(self.base_url)
        request: dict[str, Any] = dict(relay.fields)
        request["model"] = self.name
        if messages is not None:
            wired = _with_images([wire_message(m) for m in messages], relay.images)
            request["messages"] = alternating(wired) if self._merge_roles else wired
        if not isinstance(request.get("messages"), list):
            raise ModelRefused("a relayed request needs its messages")
        named = [k for k in ("max_completion_tokens", "max_tokens") if isinstance(request.get(k), int)]
        caps = [request[k] for k in named] or ([self.reply_max_tokens] if self.reply_max_tokens else [])
        if max_tokens is not None:
            caps.append(max_tokens)
        for name in named:
            del request[name]
        if caps:
            request[named[0] if named else self._length_param] = max(1, min(caps))
        if self.temperature is not None:
            request.setdefault("temperature", self.temperature)
        for name, value in self._cache_hints().items():  # the client's own hints win
            request.setdefault(name, value)
        request.pop("stream", None)
        if relay.stream:
            request["stream"] = True
        return request

    async def _relay_post(self, request: dict[str, Any], *, stream: bool) -> Any:
        """The relayed request, sent once (twice when the server's chat template refuses
        consecutive messages of one role: `_merge_roles`); the SDK's response unread (its
        headers available)."""
        openai = _import_openai()
        try:
            return await self._relay_once(request, stream=stream)
        except openai.APIStatusError as exc:
            if not (_refuses_alternation(exc) and self._alternate(request)):
                raise map_openai_error(exc, secret=self._secret, relayed=True) from self._cause(exc)
        try:
            return await self._relay_once(request, stream=stream)
        except Exception as exc:
            raise map_openai_error(exc, secret=self._secret, relayed=True) from self._cause(exc)

    async def _relay_once(self, request: dict[str, Any], *, stream: bool) -> Any:
        openai = _import_openai()
        try:
            if stream:
                return await self._client.post(
                    "/chat/completions", cast_to=object, body=request, stream=True,
                    stream_cls=openai.AsyncStream[object],
                    options={"headers": {_RAW_RESPONSE_HEADER: "stream"}, "max_retries": 0},
                )
            return await self._client.post(
                "/chat/completions", cast_to=object, body=request,
                options={"headers": {_RAW_RESPONSE_HEADER: "stream"}, "max_retries": 0},
            )
        except openai.APIStatusError:
            raise
        except Exception as exc:
            raise map_openai_error(exc, secret=self._secret, relayed=True) from self._cause(exc)

    async def _relay_whole(self, request: dict[str, Any], deadline: float | None) -> AsyncGenerator[ModelEvent | UpstreamReply, None]:
        try:
            async with asyncio.timeout_at(deadline):
                response = await self._relay_post(request, stream=False)
                data = await response.parse()
        except TimeoutError:
            raise ModelTimeout(f"the model did not answer within the {self.deadline} s deadline") from None
        except ModelError:
            raise
        except Exception as exc:
            raise self._map(exc) from self._cause(exc)
        if not isinstance(data, Mapping):
            raise ModelError("the model endpoint sent a completion that is not a JSON object")
        self._record_usage(data.get("usage"), data.get("timings"))
        yield UpstreamReply(data=data, headers=_passed(response))
        first = _first_choice(data)
        self.last_finish_reason = _field(first, "finish_reason")
        message = _field(first, "message")
        calls = [dict(c, index=i) for i, c in enumerate(_field(message, "tool_calls") or ()) if isinstance(c, Mapping)]
        for event in _delta_events({"content": _field(message, "content"), "tool_calls": calls}):
            yield event

    async def _relay_stream(self, request: dict[str, Any], deadline: float | None) -> AsyncGenerator[ModelEvent | UpstreamReply, None]:
        try:
            async with asyncio.timeout_at(deadline):
                response = await self._relay_post(request, stream=True)
        except TimeoutError:
            raise ModelTimeout(f"the model did not start answering within the {self.deadline} s deadline") from None
        headers: Mapping[str, str] = _passed(response)
        yield UpstreamReply(data={}, headers=headers)  # accepted: its status is known before any chunk
        finished = False
        chunks, reads = _sse_chunks(response), _ChunkDeadline(deadline)
        try:
            while True:
                try:
                    chunk = await reads.next(chunks)
                except TimeoutError:
                    raise ModelTimeout(f"the model's stream passed the {self.deadline} s deadline") from None
                if chunk is _END:
                    break
                yield UpstreamReply(data=chunk)
                if _field(chunk, "usage") is not None:
                    self._record_usage(_field(chunk, "usage"), _field(chunk, "timings"))
                first = _first_choice(chunk)
                if _field(first, "finish_reason"):
                    finished = True
                    self.last_finish_reason = str(_field(first, "finish_reason"))
                for event in _delta_events(_field(first, "delta")):
                    yield event
        except ModelError:
            raise
        except Exception as exc:
            if not finished:
                raise map_openai_error(exc, secret=self._secret, mid_stream=True) from self._cause(exc)
            logger.info("relayed stream broke after its finish_reason: %s", type(exc).__name__)
        finally:
            reads.close()
            await chunks.aclose()
            await _close_quietly(response)
        if not finished:
            raise ModelError("the model's stream ended before a finish_reason (answer is partial)")

    async def _stream_request(self, request: dict[str, Any]) -> AsyncIterator[ModelEvent]:
        loop = asyncio.get_running_loop()
        deadline = None if self.deadline is None else loop.time() + self.deadline
        async with self._slot(deadline) as meter:
            call_deadline = self._call_deadline(meter)
            request = self._valid(_sized_in_time(request, meter, call_deadline, "max_tokens"))
            events = self._stream_in_slot(request, call_deadline, meter)
            async with aclosing(events):  # closed before the slot is given back
                async for event in events:
                    yield event

    async def _stream_in_slot(
        self, request: dict[str, Any], deadline: float | None, meter: CallMeter
    ) -> AsyncGenerator[ModelEvent, None]:
        self.last_finish_reason = None
        try:
            async with asyncio.timeout_at(deadline):
                stream = await self._create(request, stream=True)
        except TimeoutError:
            raise ModelTimeout(f"the model did not start answering within the {self.deadline} s deadline") from None
        finished, watch = False, _StreamWatch(json_wanted="response_format" in request)
        chunks, reads = _sse_chunks(stream), _ChunkDeadline(deadline)
        try:
            while True:
                try:
                    chunk = await reads.next(chunks)
                except TimeoutError:
                    if not watch.text:
                        raise ModelTimeout(f"the model sent nothing within the {self.deadline} s deadline") from None
                    finished = self._stop_early(f"the {self.deadline} s deadline passed")
                    break
                if chunk is _END:
                    break
                events = self._events(chunk)
                for event in events:
                    yield event
                watch.read(events)
                _meter_chunk(meter, chunk)
                finished = finished or self.last_finish_reason is not None
                if not finished and (stop := watch.stop()) is not None:
                    meter.outcome, early = stop
                    finished = self._stop_early(early) if early else True
                    break
        except ModelError:
            raise
        except Exception as exc:
            if finished:  # the answer was complete; only the trailing usage/[DONE] was lost
                logger.info("model stream broke after its finish_reason: %s", type(exc).__name__)
            else:
                raise map_openai_error(exc, secret=self._secret, mid_stream=True) from self._cause(exc)
        finally:
            reads.close()
            await chunks.aclose()
            await _close_quietly(stream)
        if not finished:
            raise ModelError("the model's stream ended before a finish_reason (answer is partial)")

    def _events(self, chunk: Any) -> list[ModelEvent]:
        """A chunk's text and tool-call deltas; records its usage and its finish reason.

        ``chunk`` is the JSON object the server sent (a dict: streamed chunks are not
        turned into the SDK's models, which cost more CPU than the rest of a turn)."""
        if _field(chunk, "usage") is not None:
            self._record_usage(_field(chunk, "usage"), _field(chunk, "timings"))
        deltas: list[ModelEvent] = []
        for choice in _field(chunk, "choices") or ():
            deltas.extend(_delta_events(_field(choice, "delta")))
            if _field(choice, "finish_reason"):
                self.last_finish_reason = str(_field(choice, "finish_reason"))
        return deltas

    def _stop_early(self, why: str) -> bool:
        logger.warning("model %s: reply stopped early (%s); the partial reply is kept", self.name, why)
        self.last_finish_reason = "length"
        return True

    async def _create(self, request: dict[str, Any], *, stream: bool) -> Any:
        """``chat.completions.create``, adapting once to servers that refuse an optional parameter.

        A 400/422 that names ``max_completion_tokens`` (newer OpenAI models) switches the
        length parameter; one on a request with prompt-cache hints drops them; one on a request with
        ``stream_options`` drops usage capture. Each adaptation is remembered for later calls once it has worked.
        """
        openai = _import_openai()
        length_param, with_usage = self._length_param, stream and self._include_usage
        for _attempt in range(4):
            kwargs = dict(request)
            if "max_tokens" in kwargs and length_param != "max_tokens":
                kwargs[length_param] = kwargs.pop("max_tokens")
            if stream:
                kwargs["stream"] = True
                if with_usage:
                    kwargs["stream_options"] = {"include_usage": True}
            try:
                if stream:
                    # The SDK's ``create`` walks every message through its typed-dict
                    # transform and builds a pydantic model per chunk; the request is plain
                    # JSON already. The SDK still sends it (auth, base URL, retries, status
                    # errors), but hands back the unread response, as ``with_streaming_response``
                    # does, whose SSE lines `_sse_chunks` reads as dicts (`_events`).
                    result = await self._client.post(
                        "/chat/completions", cast_to=object, body=kwargs, stream=True,
                        stream_cls=openai.AsyncStream[object],
                        options={"headers": {_RAW_RESPONSE_HEADER: "stream"}},
                    )
                else:
                    result = await self._client.chat.completions.create(**kwargs)
            except openai.APIStatusError as exc:
                length_param, with_usage = self._adapt(exc, request, kwargs, length_param, with_usage)
                continue
            except Exception as exc:
                raise self._map(exc) from self._cause(exc)
            if length_param != self._length_param:
                self._length_param = length_param
                logger.info("model endpoint wants %s; switched", length_param)
            if stream and self._include_usage and not with_usage:
                self._include_usage = False
                logger.info("model endpoint refused stream_options; usage capture disabled")
            return result
        raise ModelError("the model endpoint refused the request")  # unreachable in practice

    def _adapt(
        self, exc: Any, request: dict[str, Any], sent: Mapping[str, Any], length_param: str, with_usage: bool
    ) -> tuple[str, bool]:
        """After a refused request (``exc``, for ``sent``): what to change in ``request`` and the
        length parameter and usage capture to try next; raises when nothing can be adapted."""
        if _refuses_alternation(exc) and self._alternate(request):
            return length_param, with_usage
        if exc.status_code not in (400, 422) and not _refuses_format(exc, sent):
            raise self._map(exc) from self._cause(exc)
        if "max_tokens" in sent and "max_completion_tokens" in str(exc):
            return "max_completion_tokens", with_usage
        if self._drop_cache_hints(request):
            return length_param, with_usage
        if "response_format" in sent:
            self._refused_format(request)
            return length_param, with_usage
        if with_usage:
            return length_param, False
        raise self._map(exc) from self._cause(exc)

    def _alternate(self, request: dict[str, Any]) -> bool:
        """After a chat template refused consecutive messages of one role: send them as one,
        in this request and every later one; False when the request has none to merge."""
        merged = alternating(request.get("messages") or [])
        if merged == request.get("messages"):
            return False
        request["messages"] = merged
        if not self._merge_roles:
            self._merge_roles = True
            logger.info("model endpoint wants user/assistant alternation; consecutive messages of one role are merged")
        return True

    def _drop_cache_hints(self, request: dict[str, Any]) -> bool:
        """After a refused request: take the prompt-cache hints out of it and never send them
        again (an endpoint that refuses fields it does not know); False when it had none."""
        dropped = [request.pop(k) for k in _CACHE_HINTS if k in request]
        if dropped:
            self._send_cache_hints = False
            logger.info("model endpoint refused the prompt cache hints; they are not sent")
        return bool(dropped)

    def _refused_format(self, request: dict[str, Any]) -> None:
        """Step down after a refused ``response_format``: json_schema → json_object → none."""
        current = request["response_format"]
        if current.get("type") == "json_schema":
            schema = current["json_schema"]["schema"]
            request["response_format"] = {"type": "json_object", "schema": schema}
            self._format = "json_object"
        else:
            del request["response_format"]
            self._format = "none"
        logger.info("model endpoint refused a response_format; now %s", self._format)

    def _map(self, exc: Exception) -> ModelError:
        return map_openai_error(exc, secret=self._secret)

    def _cause(self, exc: Exception) -> Exception | None:
        # Chain the provider error for debugging unless its text carries the key.
        if self._secret and self._secret != _NO_KEY and self._secret in str(exc):
            return None
        return exc

    async def aclose(self) -> None:
        """Close the underlying HTTP connection pool."""
        await self._client.close()


def _refuses_format(exc: Any, request: Mapping[str, Any]) -> bool:
    """A 500 refusing the request's ``response_format``: llama-cpp-python answers a
    ``json_schema`` format with its validation error as a 500 (a 400 elsewhere)."""
    return exc.status_code == 500 and "response_format" in request and "response_format" in str(exc)


_ALTERNATION = re.compile(r"alternat", re.I)


def _refuses_alternation(exc: Any) -> bool:
    """A chat template that demands user/assistant alternation refusing the request: the Jinja
    templates of Mistral, Gemma and others raise "Conversation roles must alternate
    user/assistant/user/assistant/..." (llama.cpp's server answers 500, vLLM 400)."""
    return exc.status_code in (400, 422, 500) and bool(_ALTERNATION.search(str(exc))) and "role" in str(exc).lower()


def alternating(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` (OpenAI's JSON shape) with each run of consecutive ``user`` (or
    ``assistant``) messages sent as one, their texts joined by a blank line in order: what a
    chat template that demands alternation accepts. Tool calls, tool results and the system
    message are left as they are."""
    out: list[dict[str, Any]] = []
    for message in messages:
        previous = out[-1] if out else None
        if previous is not None and _mergeable(previous) and _mergeable(message) \
                and previous["role"] == message["role"]:
            out[-1] = {**previous, "content": _joined(previous["content"], message["content"])}
        else:
            out.append(dict(message))
    return out


def _mergeable(message: Mapping[str, Any]) -> bool:
    return message.get("role") in ("user", "assistant") and not message.get("tool_calls") \
        and "tool_call_id" not in message and isinstance(message.get("content"), (str, list))


def _joined(first: str | list[Any], second: str | list[Any]) -> str | list[Any]:
    """Two message contents as one: texts joined by a blank line; parts (images) kept in order."""
    if isinstance(first, str) and isinstance(second, str):
        return f"{first}\n\n{second}"
    def parts(content: str | list[Any]) -> list[Any]:
        return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    return [*parts(first), *parts(second)]


_END = object()
"""What `_ChunkDeadline.next` returns once a stream has no more chunks."""


@dataclass
class _StreamWatch:
    """What a stream said so far, and whether it should end before the server ends it: a JSON
    object complete (a grammar lets a small model pad with blanks to its cap), a run of chunks
    with nothing visible, a verbatim loop."""

    json_wanted: bool
    text: str = ""
    blank: int = 0
    checked: int = 0
    checked_json: int = 0

    def read(self, events: Sequence[ModelEvent]) -> None:
        said = "".join(e.text for e in events if e.kind == "text")
        self.text += said
        self.blank = 0 if said.strip() else self.blank + 1

    def stop(self) -> tuple[str, str | None] | None:
        """``(the call's outcome, why it was cut or None for a clean end)``, or ``None`` to go on."""
        text = self.text
        if self.blank >= _BLANK_CHUNKS:
            return "stopped early: the reply went blank", f"{self.blank} chunks in a row brought no visible text"
        if self.json_wanted and "}" in text[self.checked_json :]:
            self.checked_json = len(text)
            if json_complete(text):
                return "stop (the JSON object was complete)", None
        if len(text) - self.checked >= _LOOP_CHECK_CHARS:
            self.checked = len(text)
            if is_looping(text):
                return "stopped early: the reply repeats itself", "the reply repeats itself"
        return None


VALID_TEXT = r"root ::= [^\x00]*"
"""A GBNF grammar admitting any text that decodes: llama.cpp's grammar sampler drops a token that
would break UTF-8, so a server that stalls on broken text (`ServerInfo.stalls_on_broken_text`)
never meets it."""

_MULTI_BYTE = re.compile("[\u0800-\U0010ffff]")
"""A character of three or more bytes in UTF-8."""


def _sized_in_time(
    request: dict[str, Any], meter: CallMeter, deadline: float | None, length_key: str
) -> dict[str, Any]:
    """``request`` with its length cap lowered to what the server writes before ``deadline`` (a
    loop time) at its measured rates (`CallLog.output_in_time`), when that is less; ``meter``
    gets its prompt size (`estimate_prompt`). The cap is the one the request names
    (``max_completion_tokens`` or ``max_tokens``), else ``length_key``.

    A client's deadline ends a call for the client, not always for the server:
    llama-cpp-python notices a closed stream only when it next sends a chunk, and it sends none
    while the tokens it has made do not decode (a small model's broken UTF-8 in Chinese; its
    issue 372), so a reply stopped at its deadline went on being generated to its
    ``max_tokens`` for nobody, and the next turn waited for it. Sized in time, it ends by
    itself about when the deadline comes (its ``finish_reason`` is ``length``)."""
    meter.prompt_size = estimate_prompt(request.get("messages") or ())
    log = meter.log
    if deadline is None or log is None:
        return request
    fits = log.output_in_time(deadline - asyncio.get_running_loop().time(), meter.prompt_size)
    named = next((k for k in ("max_completion_tokens", "max_tokens") if isinstance(request.get(k), int)), None)
    if fits is None or (named is not None and request[named] <= fits):
        return request
    return {**request, (named or length_key): fits}


def _meter_chunk(meter: CallMeter, chunk: Any) -> None:
    """Count a streamed chunk in ``meter`` (the server's usage, when a chunk carries it)."""
    meter.chunks += 1
    meter.last_chunk = time.monotonic()
    if meter.first_chunk is None:
        meter.first_chunk = meter.last_chunk
    usage = _field(chunk, "usage")
    if usage is not None:
        prompt, completion = _field(usage, "prompt_tokens"), _field(usage, "completion_tokens")
        meter.prompt_tokens = int(prompt) if isinstance(prompt, int) else meter.prompt_tokens
        meter.completion_tokens = int(completion) if isinstance(completion, int) else meter.completion_tokens


def json_complete(text: str) -> bool:
    """True when ``text`` (stripped) is one whole JSON object or array: its brackets, outside
    strings, close what it opened (the rest, if any, is padding)."""
    body = text.lstrip()
    if not body or body[0] not in "{[":
        return False
    depth, in_string, escaped = 0, False, False
    for char in body:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return True
    return False


class _ChunkDeadline:
    """A stream's deadline over its chunk reads: `next` is the next chunk, `_END` after the last,
    `TimeoutError` once the deadline passes while it waits, as ``asyncio.timeout_at`` around
    each read would; but with one timer for the whole stream, not one per chunk (a timer
    costs microseconds under uvloop, and a reply comes in tens of chunks). The timer
    interrupts only a read; past the deadline, a read is under ``asyncio.timeout_at`` again.
    `close` it when the stream ends."""

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline
        self._timer: asyncio.TimerHandle | None = None
        self._reading: asyncio.Task[Any] | None = None
        self._expiring = False

    async def next(self, chunks: AsyncGenerator[Any, None]) -> Any:
        deadline = self.deadline
        if deadline is None:
            return await anext(chunks, _END)
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        if task is None or deadline <= loop.time():
            async with asyncio.timeout_at(deadline):
                return await anext(chunks, _END)
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._expire)
        cancelling = task.cancelling()
        self._reading = task
        try:
            return await anext(chunks, _END)
        except asyncio.CancelledError:
            if self._expiring:  # the deadline's cancellation, not the caller's
                self._expiring = False
                if task.uncancel() <= cancelling:
                    raise TimeoutError from None
            raise
        finally:
            self._reading = None
            if self._expiring:  # the read ended before the cancellation reached it
                self._expiring = False
                task.uncancel()

    def _expire(self) -> None:
        self._timer = None
        if self._reading is not None:
            self._expiring = True
            self._reading.cancel()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


async def _sse_chunks(response: Any) -> AsyncGenerator[Any, None]:
    """The JSON objects of a streamed chat completion's SSE events, up to ``data: [DONE]``.

    What the SDK's ``AsyncStream`` does, without its per-event objects: an event's ``data``
    lines are joined by newlines and parsed as JSON; an object carrying ``error`` raises the
    SDK's ``APIError`` (mapped by `map_openai_error` like any other stream failure); comments,
    ``event:``, ``id:`` and ``retry:`` fields are skipped; after ``[DONE]`` the rest of the body
    is read so the connection can be reused."""
    import openai

    data: list[str] = []
    lines = _sse_lines(response.http_response)
    async for line in lines:
        if line.startswith("data:"):
            data.append(line[6:] if line.startswith("data: ") else line[5:])
            continue
        if line or not data:
            continue
        payload = "\n".join(data)
        data = []
        if payload.startswith("[DONE]"):
            # The body ends right after [DONE]; read it so the connection can be reused.
            with contextlib.suppress(Exception):
                async with asyncio.timeout(_DRAIN_S):
                    async for _ in lines:
                        pass
            return
        chunk = json.loads(payload)
        if isinstance(chunk, dict) and chunk.get("error"):
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else None
            raise openai.APIError(
                message if isinstance(message, str) and message else "An error occurred during streaming",
                request=response.http_request,
                body=error,
            )
        yield chunk


async def _sse_lines(response: Any) -> AsyncGenerator[str, None]:
    """The lines of an SSE body (``response``: the SDK's httpx response, read as it arrives),
    without their ends: split at ``\\r\\n``, ``\\n`` or ``\\r`` as the SSE format says (and the
    SDK's own decoder does, on bytes), decoded as UTF-8 (an invalid byte replaced, as httpx's
    text decoder does). One loop over the body's bytes instead of httpx's text and line
    iterators stacked on it (each an async generator step per chunk)."""
    pending = b""
    async for chunk in response.aiter_bytes():
        pending += chunk
        if not pending:
            continue
        lines = pending.splitlines(keepends=True)
        last = lines[-1]
        # An unended last line waits for more; so does one ended by \r (a \n may follow).
        pending = last if not last.endswith(b"\n") else b""
        for line in lines[:-1] if pending else lines:
            yield line.rstrip(b"\r\n").decode("utf-8", "replace")
    if pending:
        yield pending.rstrip(b"\r\n").decode("utf-8", "replace")


async def _close_quietly(stream: Any) -> None:
    close = getattr(stream, "close", None)
    if close is None:
        return
    try:
        await close()
    except Exception:  # closing a broken connection may fail again; the first error is the one that counts
        logger.debug("closing the model stream failed", exc_info=True)


def wire_message(message: ChatMessage) -> dict[str, Any]:
    """``message`` in OpenAI's JSON shape, tool calls and the answered call id included."""
    wire: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        wire["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
        wire["content"] = message.content or None
    if message.tool_call_id is not None:
        wire["tool_call_id"] = message.tool_call_id
    return wire


def _field(obj: Any, name: str) -> Any:
    """``obj[name]`` of a JSON object, or the attribute of an SDK model; ``None`` when absent."""
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _with_images(messages: list[dict[str, Any]], images: Sequence[str]) -> list[dict[str, Any]]:
    """``messages`` with ``images`` (URLs) as ``image_url`` parts of the last ``user`` message."""
    if not images:
        return messages
    for message in reversed(messages):
        if message["role"] == "user":
            text = message.get("content") or ""
            parts: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
            message["content"] = parts + [{"type": "image_url", "image_url": {"url": url}} for url in images]
            break
    return messages


def _first_choice(data: Any) -> Any:
    """The choice of index 0 of a completion or chunk (``None`` when it has none): the one a
    relayed reply stores; the others (``n`` > 1) reach the client only."""
    for choice in _field(data, "choices") or ():
        if int(_field(choice, "index") or 0) == 0:
            return choice
    return None


def _passed(response: Any) -> dict[str, str]:
    """The endpoint's response headers a relayed reply passes on (`_PASSED_HEADERS`)."""
    http = getattr(response, "http_response", None)
    headers = getattr(http, "headers", None) or {}
    return {name: str(headers[name]) for name in _PASSED_HEADERS if name in headers}


def _delta_events(delta: Any) -> list[ModelEvent]:
    if delta is None:
        return []
    events: list[ModelEvent] = []
    text = _field(delta, "content")
    if text:
        events.append(TextDelta(text=text))
    for call in _field(delta, "tool_calls") or ():
        function = _field(call, "function")
        events.append(
            ToolCallDelta(
                index=int(_field(call, "index") or 0),
                id=_field(call, "id"),
                name=_field(function, "name") if function else None,
                arguments=(_field(function, "arguments") or "") if function else "",
            )
        )
    return events
