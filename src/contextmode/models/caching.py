"""Prompt caching: how much of a request repeats the previous request of its session.

Every vendor and server that caches prompts (OpenAI, Anthropic, DeepSeek, Qwen, the llama.cpp
server, vLLM) reuses only a byte-identical **prefix** of an earlier request: one changed byte
invalidates everything after it (docs/caching.md). `request_text` writes a request as the model
receives it, one message after another in the chat-template shape most servers use
(``<|im_start|>role\\n…<|im_end|>``), so that the shared prefix of two requests is the shared
prefix of their texts; `cacheable_prefix_tokens` counts it.

The cache hints a request carries live here too: `session_cache_key` is the value of OpenAI's
``prompt_cache_key`` for a session (one per session, so requests of a session reach the same
cache), and `cache_session` names the session whose request is being sent (a context variable
the engine sets around its own model call, as `models.priority.call_priority` is).
"""

from __future__ import annotations

import contextvars
import hashlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass

from ..tokens.base import TokenCounter
from ..types import ChatMessage

__all__ = [
    "ModelUsage",
    "cache_session",
    "cacheable_prefix_tokens",
    "collect_usage",
    "current_cache_key",
    "report_usage",
    "request_text",
    "session_cache_key",
    "shared_prefix_chars",
    "usage_from",
]

_CACHE_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar("contextmode_cache_key", default=None)
_USAGE: contextvars.ContextVar[list[ModelUsage] | None] = contextvars.ContextVar("contextmode_usage", default=None)


@dataclass(frozen=True, kw_only=True)
class ModelUsage:
    """Token usage the server reported for one call."""

    prompt_tokens: int
    """Input tokens, by the server's own tokenizer (cached ones included)."""
    completion_tokens: int
    """Output tokens."""
    cached_tokens: int | None = None
    """Input tokens the server read from its prompt cache, when it says: OpenAI's, Qwen's, vLLM's
    and llama.cpp's ``prompt_tokens_details.cached_tokens``, DeepSeek's
    ``prompt_cache_hit_tokens``, llama.cpp's ``timings.cache_n``; ``None`` when it says nothing."""


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _get(obj: object, name: str) -> object:
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def usage_from(usage: object, timings: object = None) -> ModelUsage | None:
    """A reply's ``usage`` object (a mapping or the SDK's model) as `ModelUsage`; ``timings``:
    llama.cpp's ``timings`` of the same reply, read for ``cache_n`` when usage has no cached
    count. ``None`` when ``usage`` holds no prompt token count."""
    prompt = _int(_get(usage, "prompt_tokens")) if usage is not None else None
    if prompt is None:
        return None
    details = _get(usage, "prompt_tokens_details")
    cached = _int(_get(details, "cached_tokens")) if details is not None else None
    if cached is None:
        cached = _int(_get(usage, "prompt_cache_hit_tokens"))
    if cached is None and timings is not None:
        cached = _int(_get(timings, "cache_n"))
    return ModelUsage(prompt_tokens=prompt, completion_tokens=_int(_get(usage, "completion_tokens")) or 0,
                      cached_tokens=cached)


@contextmanager
def collect_usage() -> Iterator[list[ModelUsage]]:
    """Within the block, the usage each model call made in this context reports is appended to
    the yielded list (`report_usage`): a turn reads its own, whatever runs at the same time."""
    collected: list[ModelUsage] = []
    token = _USAGE.set(collected)
    try:
        yield collected
    finally:
        with suppress(ValueError):  # an async generator finalised in another context
            _USAGE.reset(token)


def report_usage(usage: ModelUsage) -> None:
    """Hand ``usage`` to the turn collecting it (`collect_usage`), if any."""
    collected = _USAGE.get()
    if collected is not None:
        collected.append(usage)


def request_text(messages: Sequence[ChatMessage]) -> str:
    """``messages`` as one text, in the order and shape a chat template gives them: what the
    server's prompt cache compares. Tool calls are written after their message's text."""
    parts: list[str] = []
    for m in messages:
        body = m.content
        if m.tool_calls:
            body += "".join(f"\n<tool_call>{c.name}({c.arguments})</tool_call>" for c in m.tool_calls)
        if m.tool_call_id is not None:
            body = f"[{m.tool_call_id}] {body}"
        parts.append(f"<|im_start|>{m.role}\n{body}<|im_end|>\n")
    return "".join(parts)


def shared_prefix_chars(previous: str, current: str) -> int:
    """Characters ``current`` shares with the start of ``previous`` (a binary search over
    slice comparisons, which run in C)."""
    low, high = 0, min(len(previous), len(current))
    while low < high:
        middle = (low + high + 1) // 2
        if previous[:middle] == current[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def cacheable_prefix_tokens(previous: str | None, current: str, counter: TokenCounter) -> int:
    """Tokens at the start of ``current`` that are a byte-identical prefix of ``previous``
    (both `request_text` s); 0 without a previous request. The boundary token is not counted
    (it may merge with the next character differently)."""
    if not previous:
        return 0
    shared = shared_prefix_chars(previous, current)
    if shared == 0:
        return 0
    tokens = counter.count(current[:shared])
    return tokens if shared == len(current) else max(0, tokens - 1)


def session_cache_key(tenant: str, session_id: str) -> str:
    """The ``prompt_cache_key`` of a session: a stable hash of its key (the ids themselves
    never leave the service; 32 hex characters, under OpenAI's 64-character limit)."""
    return hashlib.sha256(f"{tenant}\x00{session_id}".encode()).hexdigest()[:32]


@contextmanager
def cache_session(tenant: str, session_id: str) -> Iterator[None]:
    """Within the block, the model calls made in this context belong to this session: they
    carry its `session_cache_key` (OpenAI's ``prompt_cache_key``)."""
    token = _CACHE_KEY.set(session_cache_key(tenant, session_id))
    try:
        yield
    finally:
        with suppress(ValueError):  # an async generator finalised in another context
            _CACHE_KEY.reset(token)


def current_cache_key() -> str | None:
    """The cache key of the session whose request is being sent (`cache_session`), if any."""
    return _CACHE_KEY.get()
