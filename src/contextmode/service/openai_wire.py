"""OpenAI's streamed chat-completion shape, the one home of it: the chunks the chat proxy
(`routes_openai`) and its agent steps (`openai_tools`) both send."""

from __future__ import annotations

from collections.abc import Mapping

from .sse import sse_event

__all__ = ["completion_chunk", "usage_chunk"]


def completion_chunk(
    completion_id: str, created: int, model: str, delta: Mapping[str, object], finish: str | None
) -> bytes:
    """One ``chat.completion.chunk`` event: ``delta`` for the first choice, and why it ended."""
    return sse_event(
        {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": dict(delta), "finish_reason": finish}],
        }
    )


def usage_chunk(completion_id: str, created: int, model: str, usage: Mapping[str, int]) -> bytes:
    """The last chunk of a stream asked with ``stream_options.include_usage``: no choices, the usage."""
    return sse_event(
        {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model,
         "choices": [], "usage": dict(usage)}
    )
