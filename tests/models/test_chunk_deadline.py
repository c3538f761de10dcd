"""A stream's deadline over its chunk reads (`_ChunkDeadline`, one timer per stream): a read
waiting past the deadline raises `TimeoutError` and leaves its task uncancelled; the deadline
passing between reads interrupts nothing but the next read that waits; a caller's own
cancellation stays a cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from contextmode.models.openai import _END, _ChunkDeadline


async def _chunks(gaps: list[float]) -> AsyncGenerator[int, None]:
    for i, gap in enumerate(gaps):
        await asyncio.sleep(gap)
        yield i


async def test_chunks_in_time_arrive_then_the_end() -> None:
    loop = asyncio.get_running_loop()
    reads = _ChunkDeadline(loop.time() + 30)
    chunks = _chunks([0, 0, 0.01])
    assert [await reads.next(chunks) for _ in range(4)] == [0, 1, 2, _END]
    reads.close()


async def test_a_read_waiting_past_the_deadline_raises_timeout_and_the_task_goes_on() -> None:
    loop = asyncio.get_running_loop()
    reads = _ChunkDeadline(loop.time() + 0.05)
    chunks = _chunks([0, 5])
    assert await reads.next(chunks) == 0
    with pytest.raises(TimeoutError):
        await reads.next(chunks)
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await asyncio.sleep(0)  # not cancelled: the task awaits as usual
    reads.close()
    await chunks.aclose()


async def test_the_deadline_between_reads_cancels_nothing_and_the_next_waiting_read_times_out() -> None:
    loop = asyncio.get_running_loop()
    reads = _ChunkDeadline(loop.time() + 0.05)
    chunks = _chunks([0, 0.5])
    assert await reads.next(chunks) == 0
    await asyncio.sleep(0.1)  # the consumer is busy while the deadline passes: not cancelled
    with pytest.raises(TimeoutError):
        await reads.next(chunks)
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    reads.close()
    await chunks.aclose()


async def test_a_callers_cancellation_is_not_taken_for_the_deadline() -> None:
    loop = asyncio.get_running_loop()
    reads = _ChunkDeadline(loop.time() + 30)
    chunks = _chunks([5])
    reader = asyncio.create_task(reads.next(chunks))
    await asyncio.sleep(0.02)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    reads.close()
    await chunks.aclose()


async def test_no_deadline_reads_as_is() -> None:
    reads = _ChunkDeadline(None)
    chunks = _chunks([0])
    assert [await reads.next(chunks), await reads.next(chunks)] == [0, _END]
