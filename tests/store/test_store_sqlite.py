"""SQLite store across processes: 8 writer processes, a SIGKILLed writer, a dead lock holder."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from contextmode.errors import LockNotAcquired, StoreError
from contextmode.store.postings import BLOCK
from contextmode.store.sqlite import SQLiteStore
from contextmode.store.sqlite.schema import MIGRATIONS
from contextmode.testing.contract import new_turns
from contextmode.types import SessionKey

T = TypeVar("T")

WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from contextmode.errors import ConflictError
    from contextmode.store.sqlite import SQLiteStore
    from contextmode.testing.contract import new_turns
    from contextmode.types import SessionKey

    async def main(path, k, count):
        store = SQLiteStore(path)
        for i in range(count):
            turn = new_turns(1, prefix=f"w{k}:{i}")
            if k % 2:  # odd writers: compare-and-set, retried on conflict
                while True:
                    last = (await store.version(SessionKey("t", "shared"))).last_seq
                    try:
                        await store.append(SessionKey("t", "shared"), turn, expected_last_seq=last)
                        break
                    except ConflictError:
                        continue
            else:
                await store.append(SessionKey("t", "shared"), turn)
        await store.close()

    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
    """
)

CRASHER = textwrap.dedent(
    """
    import asyncio, sys
    from contextmode.store.sqlite import SQLiteStore
    from contextmode.testing.contract import new_turns
    from contextmode.types import SessionKey

    async def main(path):
        store = SQLiteStore(path)
        for i in range(100000):
            stored = await store.append(SessionKey("t", "crash"), new_turns(3, start=3 * i + 1))
            # Acknowledge only after the append returned (committed).
            sys.stdout.write(f"{stored[-1].seq}\\n")
            sys.stdout.flush()

    asyncio.run(main(sys.argv[1]))
    """
)

LOCK_HOLDER = textwrap.dedent(
    """
    import asyncio, sys
    from contextmode.store.sqlite import SQLiteStore
    from contextmode.types import SessionKey

    async def main(path):
        store = SQLiteStore(path)
        async with store.lock(SessionKey("t", "s"), ttl_s=0.5):
            print("locked", flush=True)
            await asyncio.sleep(3600)

    asyncio.run(main(sys.argv[1]))
    """
)


def _python(code: str, *args: str, **kwargs: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code, *args], text=True, **kwargs)  # type: ignore[call-overload, no-any-return]


async def test_eight_processes_append_200_turns_each(tmp_path: Path) -> None:
    path = str(tmp_path / "shared.db")
    writers = [_python(WRITER, path, str(k), "200") for k in range(8)]
    codes = await asyncio.gather(*(asyncio.to_thread(w.wait, 120) for w in writers))
    assert codes == [0] * 8
    async with SQLiteStore(path) as store:
        turns = await store.turns(SessionKey("t", "shared"))
        info = await store.info(SessionKey("t", "shared"))
    assert info is not None and info.last_seq == 1600
    assert [t.seq for t in turns] == list(range(1, 1601))
    by_writer: dict[str, list[int]] = {}
    for turn in turns:
        writer_id, index = turn.content.split()[0].split(":")
        by_writer.setdefault(writer_id, []).append(int(index))
    assert sorted(by_writer) == [f"w{k}" for k in range(8)]
    assert all(indexes == list(range(200)) for indexes in by_writer.values())


async def test_sigkill_mid_append_keeps_every_acknowledged_turn(tmp_path: Path) -> None:
    path = str(tmp_path / "crash.db")
    child = _python(CRASHER, path, stdout=subprocess.PIPE)
    assert child.stdout is not None
    acked = 0
    while acked < 600:
        line = await asyncio.to_thread(child.stdout.readline)
        assert line, "writer died before being killed"
        acked = int(line)
    os.kill(child.pid, signal.SIGKILL)
    # Acknowledgements written before the kill are still in the pipe.
    rest = await asyncio.to_thread(child.stdout.read)
    acked = max([acked, *(int(x) for x in rest.split())])
    child.wait(10)
    assert child.returncode == -signal.SIGKILL

    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    async with SQLiteStore(path) as store:
        info = await store.info(SessionKey("t", "crash"))
        turns = await store.turns(SessionKey("t", "crash"))
        state = await store.load(SessionKey("t", "crash"))
    assert info is not None
    assert info.last_seq >= acked
    assert info.last_seq % 3 == 0  # a three-turn append is all or nothing
    assert [t.seq for t in turns] == list(range(1, info.last_seq + 1))
    assert all(t.content.startswith(f"turn {t.seq} ") for t in turns)
    assert state.last_seq == info.last_seq


async def test_a_killed_lock_holder_lock_expires(tmp_path: Path) -> None:
    path = str(tmp_path / "lock.db")
    holder = _python(LOCK_HOLDER, path, stdout=subprocess.PIPE)
    assert holder.stdout is not None
    assert (await asyncio.to_thread(holder.stdout.readline)).strip() == "locked"
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(10)
    async with SQLiteStore(path) as store:
        with pytest.raises(LockNotAcquired):
            async with store.lock(SessionKey("t", "s")):
                pass
        await asyncio.sleep(0.6)
        async with store.lock(SessionKey("t", "s")) as handle:
            assert handle.token >= 2


async def test_migrations_are_recorded_once_by_name(tmp_path: Path) -> None:
    path = tmp_path / "home" / "contextmode.db"
    for _ in range(2):
        async with SQLiteStore(path) as store:
            await store.append(SessionKey("t", "s"), [])
    with sqlite3.connect(path) as raw:
        names = [r[0] for r in raw.execute("SELECT name FROM _migrations ORDER BY name")]
        mode = raw.execute("PRAGMA journal_mode").fetchone()[0]
    assert names == sorted(m.__name__ for m in MIGRATIONS)
    assert mode == "wal"


async def test_driver_errors_become_store_errors(tmp_path: Path) -> None:
    (tmp_path / "not-a-db").write_bytes(b"this is not a database file" * 100)
    store = SQLiteStore(tmp_path / "not-a-db")
    with pytest.raises(StoreError):
        await store.load(SessionKey("t", "s"))
    await store.close()


async def test_load_reads_through_indexes(tmp_path: Path) -> None:
    """The queries `load()` runs use the primary key and the emotion index, never a scan."""
    path = tmp_path / "plan.db"
    async with SQLiteStore(path) as store:
        await store.append(SessionKey("t", "s"), [])
    with sqlite3.connect(path) as raw:
        plans = [
            " ".join(str(r[3]) for r in raw.execute(f"EXPLAIN QUERY PLAN {sql}", args))
            for sql, args in [
                ("SELECT seq FROM turn_emotions WHERE tenant = ? AND session_id = ?"
                 " AND emotion >= ? AND seq < ? ORDER BY emotion DESC, seq DESC LIMIT ?",
                 ("t", "s", 0.7, 100, 5)),
                ("SELECT * FROM turns WHERE tenant = ? AND session_id = ? AND seq >= ?",
                 ("t", "s", 90)),
            ]
        ]
    assert all("SCAN" not in plan for plan in plans), plans
    assert "turn_emotions_strength" in plans[0]


class _Hops:
    """Counts the calls a store sends to its private thread."""

    def __init__(self, store: SQLiteStore) -> None:
        self.calls: list[object] = []
        self._real = store.driver._run
        store.driver._run = self._run  # type: ignore[method-assign]

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        self.calls.append(fn)
        return await self._real(fn, *args)


async def test_a_turns_store_calls_need_no_thread_hand_off_when_the_file_is_free(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "quick.db") as store:
        await store.append(SessionKey("t", "s"), new_turns(1))  # opens and migrates the file on the thread
        hops = _Hops(store)
        async with store.turn_lock(SessionKey("t", "s")):
            state = await store.load(SessionKey("t", "s"))
            await store.append(SessionKey("t", "s"), new_turns(1, start=2))
            await store.append(SessionKey("t", "s"), new_turns(1, start=3))
        claimed = await store.claim_idempotency("t", "k", "f", session_id="s", lease_s=60)
        await store.finish_idempotency("t", "k", status=200, response="{}", ttl_s=60)
        assert hops.calls == []
        assert state.last_seq == 1 and claimed is None
        assert [t.seq for t in await store.turns(SessionKey("t", "s"))] == [1, 2, 3]
        with pytest.raises(LockNotAcquired):  # the lock taken on the loop was released there
            async with store.turn_lock(SessionKey("t", "s")), store.turn_lock(SessionKey("t", "s")):
                pass


async def test_an_append_that_completes_a_recall_block_runs_on_the_thread(tmp_path: Path) -> None:
    """Merging a block's small index rows takes long (~0.2–0.5 s): never on the event loop."""
    async with SQLiteStore(tmp_path / "seal.db") as store:
        await store.append(SessionKey("t", "s"), new_turns(BLOCK - 3))  # opens and migrates on the thread
        hops = _Hops(store)
        await store.append(SessionKey("t", "s"), new_turns(1, start=BLOCK - 2))  # seq 510: the block stays open
        assert hops.calls == []
        await store.append(SessionKey("t", "s"), new_turns(1, start=BLOCK - 1))  # seq 511 completes block 0
        assert len(hops.calls) == 1
        await store.append(SessionKey("t", "s"), new_turns(1, start=BLOCK))
        assert len(hops.calls) == 1
        assert [t.seq for t in await store.turns(SessionKey("t", "s"))] == list(range(1, BLOCK + 1))
        assert (await store.index_stats(SessionKey("t", "s"))).indexed_seq == BLOCK


async def test_a_locked_file_sends_the_write_to_the_thread_and_the_loop_keeps_running(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    async with SQLiteStore(path, busy_timeout_s=10) as store:
        await store.append(SessionKey("t", "s"), new_turns(1))
        hops = _Hops(store)
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process's writer holds the file
        try:
            state = await store.load(SessionKey("t", "s"))  # WAL: a read does not wait for the writer
            assert state.last_seq == 1 and hops.calls == []
            write = asyncio.create_task(store.append(SessionKey("t", "s"), new_turns(1, start=2)))
            started = time.monotonic()
            for _ in range(10):
                await asyncio.sleep(0.01)
            assert time.monotonic() - started < 5  # the loop never waited for the lock
            assert not write.done() and len(hops.calls) == 1  # the write waits on the thread
        finally:
            other.execute("COMMIT")
            other.close()
        stored = await asyncio.wait_for(write, 10)
        assert [t.seq for t in stored] == [2]
        assert [t.seq for t in await store.turns(SessionKey("t", "s"))] == [1, 2]


@pytest.mark.parametrize("where", [":memory:", "full"])
async def test_a_memory_file_or_full_sync_keeps_every_call_on_the_thread(tmp_path: Path, where: str) -> None:
    store = SQLiteStore(":memory:") if where == ":memory:" else SQLiteStore(tmp_path / "f.db", synchronous="FULL")
    async with store:
        await store.append(SessionKey("t", "s"), new_turns(1))
        hops = _Hops(store)
        await store.append(SessionKey("t", "s"), new_turns(1, start=2))
        assert (await store.load(SessionKey("t", "s"))).last_seq == 2  # a second ":memory:" connection would see nothing
        assert len(hops.calls) == 2


async def test_a_store_used_from_another_thread_sends_its_calls_to_the_private_thread(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "threads.db") as store:
        await store.append(SessionKey("t", "s"), new_turns(1))
        await store.load(SessionKey("t", "s"))  # the loop's connection now belongs to this thread
        hops = _Hops(store)

        def elsewhere() -> int:
            return asyncio.run(store.append(SessionKey("t", "s"), new_turns(1, start=2)))[0].seq

        assert await asyncio.to_thread(elsewhere) == 2
        assert len(hops.calls) == 1
        assert (await store.load(SessionKey("t", "s"))).last_seq == 2 and len(hops.calls) == 1


async def test_the_loops_writes_are_checkpointed_by_the_private_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from contextmode.store.sqlite import driver as sqlite_store

    monkeypatch.setattr(sqlite_store, "_QUICK_CHECKPOINT_EVERY", 2)
    path = tmp_path / "wal.db"
    async with SQLiteStore(path) as store:
        await store.append(SessionKey("t", "s"), new_turns(1))
        hops = _Hops(store)
        for seq in range(2, 6):
            await store.append(SessionKey("t", "s"), new_turns(1, start=seq))
        assert [getattr(fn, "__name__", "") for fn in hops.calls] == ["_passive_checkpoint"] * 2
        assert [t.seq for t in await store.turns(SessionKey("t", "s"))] == [1, 2, 3, 4, 5]
