"""Fair streaming: deltas are coalesced (by time and size), idle streams get keep-alive pings,
and the loop stays free for other requests while a fast model streams."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from contextmode.engine import Delta, TurnEvent
from contextmode.service.sse import PING, SSEResponse
from contextmode.service.turns import coalesce


class _End:
    """Stands for the turn's last event (``done``); coalescing only reads ``kind``."""

    kind = "done"
    text = ""


async def _deltas(n: int, text: str = "ab", pause_every: int = 0, pause_s: float = 0.0) -> AsyncIterator[TurnEvent]:
    for i in range(n):
        if pause_every and i and i % pause_every == 0:
            await asyncio.sleep(pause_s)
        yield Delta(text=text)
    yield _End()  # type: ignore[misc]


async def test_a_burst_of_deltas_becomes_a_few_events_with_the_same_text() -> None:
    out = [e async for e in coalesce(_deltas(5000), flush_ms=60_000, flush_bytes=2048)]
    deltas = [e for e in out if e.kind == "delta"]
    assert "".join(e.text for e in deltas) == "ab" * 5000
    assert out[-1].kind == "done"
    assert len(deltas) <= 10_000 // 2048 + 1  # the timer never fires here: flushed by size, each event holds ~2 KB


async def test_text_waiting_is_flushed_by_the_timer_before_the_next_delta() -> None:
    # 3 deltas, then the model pauses: the waiting text goes out during the pause.
    seen: list[tuple[str, float]] = []
    loop = asyncio.get_running_loop()
    start = loop.time()
    async for event in coalesce(_deltas(6, pause_every=3, pause_s=0.5), flush_ms=20, flush_bytes=10**6):
        seen.append((event.text, loop.time() - start))
    texts = [text for text, _ in seen if text]
    assert texts == ["ababab", "ababab"]


async def test_with_zero_ms_every_delta_is_its_own_event() -> None:
    out = [e async for e in coalesce(_deltas(5), flush_ms=0, flush_bytes=10**6)]
    assert [e.kind for e in out] == ["delta"] * 5 + ["done"]


async def test_a_failure_sends_the_waiting_text_first() -> None:
    async def broken() -> AsyncIterator[TurnEvent]:
        yield Delta(text="half ")
        yield Delta(text="answer")
        raise RuntimeError("model broke")

    got: list[str] = []
    try:
        async for event in coalesce(broken(), flush_ms=1000, flush_bytes=10**6):
            got.append(event.text)
    except RuntimeError:
        pass
    assert got == ["half answer"]


async def test_other_tasks_run_while_a_fast_stream_is_coalesced() -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    try:
        async for _ in coalesce(_deltas(2000), flush_ms=50, flush_bytes=2048):
            pass
    finally:
        task.cancel()
    assert ticks >= 1000  # the ticker ran between deltas, not only after the stream


async def test_an_idle_stream_gets_keep_alive_pings_and_the_iterator_is_closed() -> None:
    closed = asyncio.Event()

    async def slow() -> AsyncIterator[bytes]:
        try:
            yield b"data: 1\n\n"
            await asyncio.sleep(0.35)
            yield b"data: 2\n\n"
        finally:
            closed.set()

    sent: list[bytes] = []

    async def send(message: dict[str, object]) -> None:
        if message["type"] == "http.response.body":
            sent.append(message.get("body", b""))  # type: ignore[arg-type]

    async def receive() -> dict[str, object]:
        await asyncio.sleep(10)
        return {"type": "http.disconnect"}

    response = SSEResponse(slow(), ping_s=0.1)
    await response({"type": "http"}, receive, send)
    body = b"".join(sent)
    assert body.startswith(b"data: 1\n\n") and body.endswith(b"data: 2\n\n")
    assert body.count(PING) >= 1
    assert closed.is_set()
