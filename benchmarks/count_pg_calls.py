"""Pool acquisitions and statements per turn on PostgreSQL, through the service in process.

    PYTHONPATH=src python benchmarks/count_pg_calls.py [sessions] [turns] [--stream] [--concurrent]

``sessions`` conversations (default 8) of ``turns`` turns each (default 10), one after the
other, through the real service app (httpx's ASGI transport) on a fresh PostgreSQL schema
(``CONTEXTMODE_TEST_PG_DSN``) with the offline processors, the ``default`` strategy, the BM25
recaller and an in-process model, as ``benchmarks/load.py``'s workers have them; each turn's
background jobs and trace write are drained before the next (``--concurrent``: the
conversations run at once, drained at the end, as ``load.py``'s users do). Counted by wrapping asyncpg's
``Pool._acquire`` and ``Connection.execute/fetch/fetchrow/fetchval`` (``BEGIN``/``COMMIT``
included). Prints one JSON line: per-turn means of acquisitions and statements, and of this
process's CPU (service, client and model in one process: a rough figure).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from contextmode.types import SessionKey

PG_DSN = os.environ.get("CONTEXTMODE_TEST_PG_DSN") or "postgresql://postgres@127.0.0.1:5432/test"
COUNTS: Counter[str] = Counter()


def _count(owner: Any, name: str, label: str) -> None:
    fn: Callable[..., Any] = getattr(owner, name)

    async def counted(*args: Any, **kwargs: Any) -> Any:
        COUNTS[label] += 1
        return await fn(*args, **kwargs)

    setattr(owner, name, counted)


def instrument() -> None:
    import asyncpg
    import asyncpg.pool

    _count(asyncpg.pool.Pool, "_acquire", "acquisitions")
    for name in ("execute", "fetch", "fetchrow", "fetchval"):
        _count(asyncpg.Connection, name, "statements")


def reply(messages: Sequence[Any]) -> list[str]:
    return ["Sure, ", "here is a short answer about ", messages[-1].content[:24]]


async def main(sessions: int, turns: int, stream: bool, together: bool) -> dict[str, Any]:
    import asyncpg
    import httpx

    from contextmode.api import build_engine
    from contextmode.engine import Processors
    from contextmode.service import ServiceSettings, create_app
    from contextmode.settings import EngineSettings
    from contextmode.store.postgres import PostgresStore
    from contextmode.testing import CharTokenCounter
    from contextmode.testing.models import FunctionModel

    schema = f"cm_count_{uuid.uuid4().hex[:10]}"
    store = PostgresStore(PG_DSN, schema=schema)
    engine = build_engine(store=store, model=FunctionModel(reply), counter=CharTokenCounter(),
                          processors=Processors.offline(), settings=EngineSettings())
    settings = ServiceSettings(image_dir=Path(tempfile.mkdtemp(prefix="cm-count-")))
    words = ["tea", "Kyoto", "my sister Lucy", "the budget", "temples", "spicy food", "April", "trains"]
    try:
        await store.version(SessionKey("local", "warm-up"))
        instrument()
        COUNTS.clear()
        cpu = time.process_time()
        transport = httpx.ASGITransport(app=create_app(engine, settings))
        async with httpx.AsyncClient(transport=transport, base_url="http://count.test") as client:

            async def converse(s: int) -> None:
                for t in range(turns):
                    message = f"turn {t}: tell me about {words[(s + t) % len(words)]} and {words[t % len(words)]}"
                    r = await client.post(f"/v1/sessions/c{s}/messages", json={"message": message, "stream": stream})
                    r.raise_for_status()
                    if not together:
                        await engine.drain()

            if together:
                await asyncio.gather(*(converse(s) for s in range(sessions)))
                await engine.drain()
            else:
                for s in range(sessions):
                    await converse(s)
        done = sessions * turns
        cpu = time.process_time() - cpu
        return {
            "cpu_ms_per_turn": round(cpu * 1000 / done, 2),
            "turns": done,
            "stream": stream,
            "acquisitions_per_turn": round(COUNTS["acquisitions"] / done, 2),
            "statements_per_turn": round(COUNTS["statements"] / done, 2),
            "concurrent": together,
            "pool_size": store.driver._pool.get_size(),
        }
    finally:
        await engine.close()
        conn = await asyncpg.connect(PG_DSN)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    result = asyncio.run(main(int(args[0]) if args else 8, int(args[1]) if len(args) > 1 else 10,
                              "--stream" in sys.argv, "--concurrent" in sys.argv))
    print(json.dumps(result))
