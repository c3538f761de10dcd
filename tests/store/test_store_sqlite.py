"""SQLite store across processes: 8 writer processes, a SIGKILLed writer, a dead lock holder."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from contextmode.errors import LockNotAcquired, StoreError
from contextmode.store._sqlite_schema import MIGRATIONS
from contextmode.store.sqlite import SQLiteStore

WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from contextmode.errors import ConflictError
    from contextmode.store.sqlite import SQLiteStore
    from contextmode.testing.contract import new_turns

    async def main(path, k, count):
        store = SQLiteStore(path)
        for i in range(count):
            turn = new_turns(1, prefix=f"w{k}:{i}")
            if k % 2:  # odd writers: compare-and-set, retried on conflict
                while True:
                    last = (await store.version("t", "shared")).last_seq
                    try:
                        await store.append("t", "shared", turn, expected_last_seq=last)
                        break
                    except ConflictError:
                        continue
            else:
                await store.append("t", "shared", turn)
        await store.close()

    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
    """
)

CRASHER = textwrap.dedent(
    """
    import asyncio, sys
    from contextmode.store.sqlite import SQLiteStore
    from contextmode.testing.contract import new_turns

    async def main(path):
        store = SQLiteStore(path)
        for i in range(100000):
            stored = await store.append("t", "crash", new_turns(3, start=3 * i + 1))
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

    async def main(path):
        store = SQLiteStore(path)
        async with store.lock("t", "s", ttl_s=0.5):
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
        turns = await store.turns("t", "shared")
        info = await store.info("t", "shared")
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
        info = await store.info("t", "crash")
        turns = await store.turns("t", "crash")
        state = await store.load("t", "crash")
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
            async with store.lock("t", "s"):
                pass
        await asyncio.sleep(0.6)
        async with store.lock("t", "s") as handle:
            assert handle.token >= 2


async def test_migrations_are_recorded_once_by_name(tmp_path: Path) -> None:
    path = tmp_path / "home" / "contextmode.db"
    for _ in range(2):
        async with SQLiteStore(path) as store:
            await store.append("t", "s", [])
    with sqlite3.connect(path) as raw:
        names = [r[0] for r in raw.execute("SELECT name FROM _migrations ORDER BY name")]
        mode = raw.execute("PRAGMA journal_mode").fetchone()[0]
    assert names == sorted(m.__name__ for m in MIGRATIONS)
    assert mode == "wal"


async def test_driver_errors_become_store_errors(tmp_path: Path) -> None:
    (tmp_path / "not-a-db").write_bytes(b"this is not a database file" * 100)
    store = SQLiteStore(tmp_path / "not-a-db")
    with pytest.raises(StoreError):
        await store.load("t", "s")
    await store.close()


async def test_load_reads_through_indexes(tmp_path: Path) -> None:
    """The queries `load()` runs use the primary key and the emotion index, never a scan."""
    path = tmp_path / "plan.db"
    async with SQLiteStore(path) as store:
        await store.append("t", "s", [])
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
