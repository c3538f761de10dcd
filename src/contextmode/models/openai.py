"""`OpenAIChatModel`: any OpenAI-compatible chat-completions endpoint through the official client.

Works with OpenAI, DeepSeek, Qwen (DashScope compatible mode), vLLM, Ollama and
the llama.cpp server (see docs/models.md). Provider errors are translated to
`contextmode.errors` in one place, `map_openai_error`; the API key never
appears in a ``repr``, an error message or a log line.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, MissingExtra, ModelError, ModelTimeout, ModelUnavailable
from ..types import ChatMessage
from .base import ModelEvent, TextDelta, ToolCallDelta, ToolChoice, ToolSpec
from .settings import LLMSettings, check_model_request_allowed

if TYPE_CHECKING:
    from openai import AsyncOpenAI

__all__ = ["ModelUsage", "OpenAIChatModel", "map_openai_error", "wire_message"]

logger = logging.getLogger("contextmode.models.openai")

_KEY_LIKE = re.compile(r"\b(sk|pk|key|api[-_]?key)-[A-Za-z0-9_\-]{8,}", re.I)
_NO_KEY = "not-needed"  # local servers (Ollama, vLLM, llama.cpp) ignore the key but the client wants one


@dataclass(frozen=True, kw_only=True)
class ModelUsage:
    """Token usage the server reported for one call."""

    prompt_tokens: int
    """Input tokens, by the server's own tokenizer."""
    completion_tokens: int
    """Output tokens."""


def _scrub(text: str, secret: str | None) -> str:
    if secret and secret != _NO_KEY:
        text = text.replace(secret, "***")
    return _KEY_LIKE.sub("***", text)


def map_openai_error(
    exc: BaseException, *, secret: str | None = None, mid_stream: bool = False
) -> ModelError:
    """Translate an openai/httpx exception into the `ModelError` tree (the one place this happens).

    ``APITimeoutError`` and transport timeouts → `ModelTimeout`; 429, 5xx and
    connection failures → `ModelUnavailable`; anything else (4xx, malformed
    responses) → `ModelError`. With ``mid_stream`` (the answer had started) a
    non-timeout failure is a plain `ModelError`: the stream broke, the partial
    answer stands. ``secret`` is scrubbed from the message, as is anything
    shaped like an API key.
    """
    import openai

    detail = _scrub(f"{type(exc).__name__}: {exc}", secret)
    if isinstance(exc, openai.APITimeoutError) or "Timeout" in type(exc).__name__:
        return ModelTimeout(f"the model did not answer in time ({detail})")
    if mid_stream:
        return ModelError(f"the model's stream broke before the end; the answer is partial ({detail})")
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        if status == 429 or status >= 500:
            return ModelUnavailable(f"the model endpoint answered HTTP {status} ({detail})")
        return ModelError(f"the model endpoint refused the request with HTTP {status} ({detail})")
    if isinstance(exc, openai.APIConnectionError):
        return ModelUnavailable(f"could not reach the model endpoint ({detail})")
    return ModelError(f"the model call failed ({detail})")


def _import_openai() -> Any:
    try:
        import openai
    except ImportError as exc:
        raise MissingExtra("openai", "openai") from exc
    return openai


class OpenAIChatModel:
    """A `ChatModel` over ``AsyncOpenAI``'s ``chat.completions.create``.

    ``stream()`` yields text deltas; if the stream breaks or ends without a
    ``finish_reason`` it raises `ModelError` *after* yielding what arrived, so
    the caller can keep a partial answer (seed 000).
    """

    def __init__(
        self,
        *,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 2,
        extra_headers: Mapping[str, str] | None = None,
        temperature: float | None = None,
        include_usage: bool = True,
        on_usage: Callable[[ModelUsage], None] | None = None,
        client: AsyncOpenAI | None = None,
    ) -> None:
        """``timeout`` in seconds (connect and each read); ``include_usage`` asks for usage on streams
        (dropped automatically if the server refuses it); ``on_usage`` receives each call's usage."""
        openai = _import_openai()
        self.name = model
        self.base_url = base_url
        self.temperature = temperature
        self.on_usage = on_usage
        self.last_usage: ModelUsage | None = None
        """Usage of the most recent call that reported one (for logs; racy under concurrency)."""
        self._include_usage = include_usage
        self._length_param = "max_tokens"
        self._secret = api_key
        if client is None:
            try:
                client = openai.AsyncOpenAI(
                    api_key=api_key or (_NO_KEY if base_url else None),
                    base_url=base_url,
                    timeout=timeout,
                    max_retries=max_retries,
                    default_headers=dict(extra_headers or {}),
                )
            except openai.OpenAIError as exc:  # e.g. no key at all for api.openai.com
                raise ConfigError(
                    _scrub(f"cannot configure the OpenAI client: {exc}", api_key)
                    + " (set CONTEXTMODE_LLM_API_KEY)"
                ) from None
        self._client = client
        resolved = getattr(client, "api_key", None)  # OPENAI_API_KEY when no key was passed
        if isinstance(resolved, str) and resolved and not self._secret:
            self._secret = resolved

    @classmethod
    def from_settings(cls, settings: LLMSettings, **overrides: Any) -> OpenAIChatModel:
        """Build from `LLMSettings`; ``overrides`` win over the settings' values."""
        if not settings.model:
            raise ConfigError("CONTEXTMODE_LLM_MODEL is not set")
        kwargs: dict[str, Any] = {
            "model": settings.model,
            "base_url": settings.base_url,
            "api_key": settings.api_key,
            "timeout": settings.timeout,
            "max_retries": settings.max_retries,
            "extra_headers": settings.extra_headers,
            "temperature": settings.temperature,
        }
        kwargs.update(overrides)
        return cls(**kwargs)

    def __repr__(self) -> str:
        key = "***" if self._secret else None
        return f"OpenAIChatModel(name={self.name!r}, base_url={self.base_url!r}, api_key={key!r})"

    def _request(self, messages: Sequence[ChatMessage], max_tokens: int | None) -> dict[str, Any]:
        check_model_request_allowed(self.base_url)
        request: dict[str, Any] = {
            "model": self.name,
            "messages": [wire_message(m) for m in messages],
        }
        if max_tokens is not None:
            request["max_tokens"] = max_tokens
        if self.temperature is not None:
            request["temperature"] = self.temperature
        return request

    def _record_usage(self, usage: Any) -> None:
        if usage is None:
            return
        try:
            record = ModelUsage(
                prompt_tokens=int(usage.prompt_tokens or 0),
                completion_tokens=int(usage.completion_tokens or 0),
            )
        except (AttributeError, TypeError, ValueError):
            return
        self.last_usage = record
        if self.on_usage is not None:
            self.on_usage(record)
        logger.debug("model %s usage: %s", self.name, record)

    async def complete(self, messages: Sequence[ChatMessage], *, max_tokens: int | None = None) -> str:
        """The whole answer at once (non-streaming request)."""
        request = self._request(messages, max_tokens)
        completion = await self._create(request, stream=False)
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
        async for event in self.stream_events(messages, max_tokens=max_tokens):
            if event.kind == "text":
                yield event.text

    async def stream_events(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[ToolSpec] = (),
        tool_choice: ToolChoice | None = None,
        max_tokens: int | None = None,
    ) -> AsyncIterator[ModelEvent]:
        """Text and tool-call deltas as they arrive (``tools`` offered when given); raise
        `ModelError` subclasses on failure, including a stream that ends before its finish_reason."""
        request = self._request(messages, max_tokens)
        if tools:
            request["tools"] = [dict(t) for t in tools]
        if tool_choice is not None:
            request["tool_choice"] = tool_choice if isinstance(tool_choice, str) else dict(tool_choice)
        stream = await self._create(request, stream=True)
        finished = False
        try:
            async for chunk in stream:
                if getattr(chunk, "usage", None) is not None:
                    self._record_usage(chunk.usage)
                for choice in chunk.choices or ():
                    for event in _delta_events(choice.delta):
                        yield event
                    if choice.finish_reason:
                        finished = True
        except ModelError:
            raise
        except Exception as exc:
            if finished:  # the answer was complete; only the trailing usage/[DONE] was lost
                logger.info("model stream broke after its finish_reason: %s", type(exc).__name__)
            else:
                raise map_openai_error(exc, secret=self._secret, mid_stream=True) from self._cause(exc)
        finally:
            await _close_quietly(stream)
        if not finished:
            raise ModelError("the model's stream ended before a finish_reason (answer is partial)")

    async def _create(self, request: dict[str, Any], *, stream: bool) -> Any:
        """``chat.completions.create``, adapting once to servers that refuse an optional parameter.

        A 400/422 that names ``max_completion_tokens`` (newer OpenAI models) switches the
        length parameter; a 400/422 on a request with ``stream_options`` drops usage capture.
        Each adaptation is remembered for later calls once it has worked.
        """
        openai = _import_openai()
        length_param, with_usage = self._length_param, stream and self._include_usage
        for _attempt in range(3):
            kwargs = dict(request)
            if "max_tokens" in kwargs and length_param != "max_tokens":
                kwargs[length_param] = kwargs.pop("max_tokens")
            if stream:
                kwargs["stream"] = True
                if with_usage:
                    kwargs["stream_options"] = {"include_usage": True}
            try:
                result = await self._client.chat.completions.create(**kwargs)
            except openai.APIStatusError as exc:
                refused = exc.status_code in (400, 422)
                if refused and "max_tokens" in kwargs and "max_completion_tokens" in str(exc):
                    length_param = "max_completion_tokens"
                    continue
                if refused and with_usage:
                    with_usage = False
                    continue
                raise self._map(exc) from self._cause(exc)
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


def _delta_events(delta: Any) -> list[ModelEvent]:
    if delta is None:
        return []
    events: list[ModelEvent] = []
    text = getattr(delta, "content", None)
    if text:
        events.append(TextDelta(text=text))
    for call in getattr(delta, "tool_calls", None) or ():
        function = getattr(call, "function", None)
        events.append(
            ToolCallDelta(
                index=int(getattr(call, "index", 0) or 0),
                id=getattr(call, "id", None),
                name=getattr(function, "name", None) if function else None,
                arguments=(getattr(function, "arguments", None) or "") if function else "",
            )
        )
    return events
