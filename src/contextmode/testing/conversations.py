"""Simulated users for multi-worker tests and load runs: tagged messages, retries on another worker.

Every user message made by `message_for` carries ``[conv:<session>#<index>]``, so any
stored turn (and the recording summariser's input) can be traced back to the
conversation and turn that sent it.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Conversation", "SentTurn", "converse", "message_for", "turn_index"]

_TAG_RE = re.compile(r"\[conv:([A-Za-z0-9._:-]{1,128})#(\d+)\]")

_QUESTIONS = (
    "我下周去杭州出差三天，预算两千以内，有什么住宿建议？",
    "最好离西湖近一点，我不吃辣。",
    "那附近有什么好吃的本帮菜？",
    "Can you compare the two hotels you mentioned in terms of price?",
    "第二家的早餐怎么样？",
    "帮我把行程按天列一下。",
    "第一天下午可以怎么安排？",
    "What about rainy days?",
    "再推荐一家咖啡馆。",
    "I also need a quiet place to work for two hours.",
)


def message_for(session_id: str, index: int) -> str:
    """The ``index``-th (0-based) user message of a conversation, tagged so every stored
    turn can be traced back to the conversation and turn that sent it."""
    return f"[conv:{session_id}#{index}] {_QUESTIONS[index % len(_QUESTIONS)]}"


def turn_index(content: str) -> tuple[str, int] | None:
    """``(session_id, index)`` from a message made by `message_for`, or ``None``."""
    found = _TAG_RE.search(content)
    return (found.group(1), int(found.group(2))) if found else None


@dataclass(frozen=True, kw_only=True)
class SentTurn:
    """One acknowledged turn: what was sent and what the service answered."""

    index: int
    user_seq: int
    seq: int | None
    latency_s: float
    """Client wall time of the acknowledged attempt, seconds."""
    worker: str
    retried: bool
    """True when an earlier attempt of this turn failed (its user turn may be stored too)."""
    recent_items: int = 0
    """Turns the worker put in the context's ``recent`` layer (what it loaded from the store)."""


@dataclass
class Conversation:
    session_id: str
    turns: list[SentTurn] = field(default_factory=list)
    transport_errors: int = 0
    http_errors: list[str] = field(default_factory=list)


async def converse(
    client: Any,
    urls: Callable[[], Sequence[str]] | Sequence[str],
    session_id: str,
    turns: int,
    *,
    rng: random.Random,
    attempts: int = 8,
    think_s: float = 0.0,
    deadline: float | None = None,
) -> Conversation:
    """Send ``turns`` messages one after the other, each to a random worker.

    A transport error (refused, reset, timeout) is retried on another worker after a
    short pause, up to ``attempts`` times per turn; an HTTP error response is recorded
    and the conversation stops. ``deadline`` (``time.monotonic()``) stops it early.
    """
    conversation = Conversation(session_id=session_id)
    for index in range(turns):
        if deadline is not None and time.monotonic() >= deadline:
            break
        message = message_for(session_id, index)
        avoid: str | None = None
        for attempt in range(attempts):
            candidates = list(urls() if callable(urls) else urls)
            choices = [u for u in candidates if u != avoid] or candidates
            url = rng.choice(choices)
            started = time.perf_counter()
            try:
                response = await client.post(f"{url}/v1/sessions/{session_id}/messages", json={"message": message})
            except Exception as exc:  # httpx.TransportError and friends: the worker is gone
                if not _is_transport_error(exc):
                    raise
                conversation.transport_errors += 1
                avoid = url
                await asyncio.sleep(0.05 * (attempt + 1))
                continue
            if response.status_code != 200:
                conversation.http_errors.append(f"{response.status_code} {response.text[:200]}")
                return conversation
            data = response.json()["data"]
            layers = {layer["name"]: layer for layer in data["context"]["layers"]}
            conversation.turns.append(
                SentTurn(index=index, user_seq=data["user_seq"], seq=data["seq"],
                         latency_s=time.perf_counter() - started, worker=url, retried=attempt > 0,
                         recent_items=int(layers.get("recent", {}).get("items", 0)))
            )
            break
        else:
            conversation.http_errors.append(f"turn {index}: no worker answered after {attempts} attempts")
            return conversation
        if think_s:
            await asyncio.sleep(think_s)
    return conversation


def _is_transport_error(exc: Exception) -> bool:
    import httpx

    return isinstance(exc, httpx.TransportError)
