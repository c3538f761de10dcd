"""Bytes a store keeps per exchange, by kind of record, on SQLite, PostgreSQL and Redis.

    python benchmarks/bench_storage.py --data ../shared/data [--exchanges 200]
        [--conversations 1] [--backends sqlite,postgres,redis]

Replays real conversations through the shipped defaults (`build_engine`: offline
processors, BM25 recall, the default strategy and settings) with a stub model that
answers with the conversation's own next line, so both roles are real text:

- the first ``--conversations`` LoCoMo dev conversations (``locomo/locomo_dev.json``:
  speaker A's lines are the user's messages, speaker B's the answers);
- a Chinese conversation from CPED (``cped/valid_split.csv``: the first TV series'
  utterances in order, alternately message and answer).

Each conversation runs ``--exchanges`` exchanges in its own session, then the background
jobs are drained and the store is measured per kind of record (the kinds erasure counts,
`store.lifecycle`): SQLite pages per table and index (``dbstat``), PostgreSQL
``pg_total_relation_size`` (heap, TOAST, indexes, with the ``sessions`` table's dead
tuples), Redis ``MEMORY USAGE`` of every key. Printed per exchange and as the ratio to
the raw text of both roles; the last line is a JSON object. PostgreSQL
(``CONTEXTMODE_TEST_PG_DSN``) and Redis (``CONTEXTMODE_TEST_REDIS_URL``) run in a
throwaway schema / namespace and are skipped with a note when absent.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import sqlite3
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from contextmode.api import build_engine
from contextmode.engine import TurnRequest
from contextmode.settings import EngineSettings
from contextmode.store.lifecycle import REDIS_SESSION_KEYS, SQL_SESSION_TABLES
from contextmode.testing.models import ScriptedModel
from contextmode.types import SessionKey

PG_DSN = os.environ.get("CONTEXTMODE_TEST_PG_DSN") or "postgresql://postgres@127.0.0.1:5432/test"
REDIS_URL = os.environ.get("CONTEXTMODE_TEST_REDIS_URL") or "redis://127.0.0.1:6379/0"
TENANT = "bench"


@dataclass(frozen=True)
class Conversation:
    name: str
    pairs: Sequence[tuple[str, str]]
    """(message, answer) in order."""

    @property
    def raw_bytes(self) -> int:
        return sum(len(m.encode()) + len(a.encode()) for m, a in self.pairs)


def locomo(path: Path, count: int, exchanges: int) -> list[Conversation]:
    """Speaker A's lines as messages, each answered by what speaker B said next."""
    out = []
    for sample in json.loads(path.read_text())[:count]:
        conv = sample["conversation"]
        lines = [
            (x["speaker"] == conv["speaker_a"], x["text"])
            for n in range(1, 100) if f"session_{n}" in conv for x in conv[f"session_{n}"]
        ]
        pairs = [
            (text, lines[i + 1][1]) for i, (is_a, text) in enumerate(lines[:-1]) if is_a and not lines[i + 1][0]
        ]
        out.append(Conversation(f"locomo:{sample['sample_id']}", pairs[:exchanges]))
    return out


def cped(path: Path, exchanges: int) -> Conversation:
    """The first series' utterances in order, alternately message and answer."""
    with path.open(encoding="utf-8-sig", newline="") as f:
        rows = list(csv.DictReader(f))
    first = rows[0]["TV_ID"]
    texts = [r["Utterance"].strip() for r in rows if r["TV_ID"] == first and r["Utterance"].strip()]
    pairs = list(zip(texts[0::2], texts[1::2], strict=False))
    return Conversation(f"cped:tv{first}", pairs[:exchanges])


# -- measuring -----------------------------------------------------------------------

_SQL_KIND = {k.table: k.kind for k in SQL_SESSION_TABLES} | {"sessions": "sessions"}
_REDIS_KIND = {k.prefix: k.kind for k in REDIS_SESSION_KEYS} | {"s": "sessions"}


def sqlite_bytes(path: Path) -> dict[str, int]:
    """Bytes of the pages of each table and its indexes, by kind of record."""
    db = sqlite3.connect(path)
    try:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        owner = dict(db.execute("SELECT name, tbl_name FROM sqlite_master WHERE type IN ('table', 'index')"))
        out: dict[str, int] = {}
        for name, size in db.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name"):
            kind = _SQL_KIND.get(owner.get(name, name), "other")
            out[kind] = out.get(kind, 0) + int(size)
        return out
    finally:
        db.close()


async def postgres_bytes(schema: str) -> tuple[dict[str, int], dict[str, int]]:
    """``pg_total_relation_size`` by kind, and the ``sessions`` table's live/dead tuples."""
    import asyncpg

    conn = await asyncpg.connect(PG_DSN)
    try:
        await conn.execute(f'ANALYZE "{schema}".sessions')
        rows = await conn.fetch(
            "SELECT c.relname, pg_total_relation_size(c.oid) AS size FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relkind = 'r'", schema)
        out: dict[str, int] = {}
        for row in rows:
            kind = _SQL_KIND.get(row["relname"], "other")
            out[kind] = out.get(kind, 0) + int(row["size"])
        stat = await conn.fetchrow(
            "SELECT n_live_tup, n_dead_tup, n_tup_upd, n_tup_hot_upd, pg_relation_size(relid) AS heap"
            " FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'sessions'", schema)
        return out, dict(stat) if stat else {}
    finally:
        await conn.close()


async def redis_bytes(namespace: str) -> dict[str, int]:
    """``MEMORY USAGE`` of every key of the namespace, by kind."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(REDIS_URL)
    out: dict[str, int] = {}
    try:
        async for key in client.scan_iter(match=f"{namespace}*", count=1000):
            prefix = key.decode()[len(namespace):].split(":", 1)[0]
            kind = _REDIS_KIND.get(prefix, "other")
            out[kind] = out.get(kind, 0) + int(await client.memory_usage(key, samples=0) or 0)
    finally:
        await client.aclose()
    return out


def codecs(path: Path) -> dict[str, dict[str, float]]:
    """The kept traces' and texts' JSON (unpacked) compressed again by each candidate codec:
    total bytes, and microseconds to compress and decompress one body (median)."""
    import bz2
    import lzma
    import statistics
    import time
    import zlib

    from contextmode.store.trace_pack import _ZDICT_2, unpack_text

    db = sqlite3.connect(path)
    try:
        bodies = [unpack_text(b).encode() for (b,) in db.execute(
            "SELECT body FROM turn_traces UNION ALL SELECT body FROM trace_texts")]
    finally:
        db.close()

    def zlib_with(level: int, zdict: bytes | None) -> tuple[Any, Any]:
        def pack(b: bytes) -> bytes:
            c = zlib.compressobj(level, zlib.DEFLATED, 15, 9, zlib.Z_DEFAULT_STRATEGY, *([zdict] if zdict else []))
            return c.compress(b) + c.flush()

        def unpack(b: bytes) -> bytes:
            d = zlib.decompressobj(15, *([zdict] if zdict else []))
            return d.decompress(b) + d.flush()
        return pack, unpack

    candidates: dict[str, tuple[Any, Any]] = {
        "none": (lambda b: b, lambda b: b),
        "zlib-6": zlib_with(6, None),
        "zlib-9": zlib_with(9, None),
        "zlib-9+dictionary (shipped)": zlib_with(9, _ZDICT_2),
        "lzma-9": (lambda b: lzma.compress(b, preset=9), lzma.decompress),
        "bz2-9": (lambda b: bz2.compress(b, 9), bz2.decompress),
    }
    try:
        import zstandard

        zd = zstandard.ZstdCompressionDict(_ZDICT_2, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
        candidates["zstd-19"] = (zstandard.ZstdCompressor(level=19).compress,
                                 zstandard.ZstdDecompressor().decompress)
        candidates["zstd-19+dictionary"] = (zstandard.ZstdCompressor(level=19, dict_data=zd).compress,
                                            zstandard.ZstdDecompressor(dict_data=zd).decompress)
    except ImportError:
        pass
    out: dict[str, dict[str, float]] = {}
    for name, (pack, unpack) in candidates.items():
        sizes, pack_us, unpack_us = 0, [], []
        for body in bodies:
            started = time.perf_counter()
            packed = pack(body)
            pack_us.append((time.perf_counter() - started) * 1e6)
            started = time.perf_counter()
            assert unpack(packed) == body
            unpack_us.append((time.perf_counter() - started) * 1e6)
            sizes += len(packed)
        out[name] = {"bytes": sizes, "pack_us": round(statistics.median(pack_us), 1),
                     "unpack_us": round(statistics.median(unpack_us), 1)}
    return out


# -- replaying -----------------------------------------------------------------------


async def replay(url: str, conversations: Sequence[Conversation]) -> None:
    answers = [a for c in conversations for _, a in c.pairs]
    engine = build_engine(store=url, model=ScriptedModel(answers), processors="offline",
                          settings=EngineSettings())
    try:
        for n, conv in enumerate(conversations):
            key = SessionKey(TENANT, f"s{n}")
            for message, _ in conv.pairs:
                await engine.turn(TurnRequest(key=key, message=message))
        await engine.drain()
    finally:
        await engine.close()


@asynccontextmanager
async def sqlite_url() -> AsyncIterator[tuple[str, Path]]:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "bench.db"
        yield f"sqlite:///{path}", path


@asynccontextmanager
async def postgres_url() -> AsyncIterator[tuple[str, str]]:
    import asyncpg

    admin = await asyncpg.connect(PG_DSN, timeout=3)
    schema = f"cm_bench_{uuid.uuid4().hex[:10]}"
    try:
        yield f"{PG_DSN}{'&' if '?' in PG_DSN else '?'}schema={schema}", schema
    finally:
        await admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await admin.close()


@asynccontextmanager
async def redis_url() -> AsyncIterator[tuple[str, str]]:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(REDIS_URL, socket_connect_timeout=3)
    await client.ping()
    namespace = f"cmbench:{uuid.uuid4().hex[:10]}:"
    try:
        yield f"{REDIS_URL}{'&' if '?' in REDIS_URL else '?'}namespace={namespace}", namespace
    finally:
        keys = [k async for k in client.scan_iter(match=f"{namespace}*", count=1000)]
        if keys:
            await client.delete(*keys)
        await client.aclose()


async def measure(backend: str, conversations: Sequence[Conversation]) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    if backend == "sqlite":
        async with sqlite_url() as (url, path):
            await replay(url, conversations)
            kinds = sqlite_bytes(path)
            extra["file_bytes"] = path.stat().st_size
            extra["codecs"] = codecs(path)
    elif backend == "postgres":
        async with postgres_url() as (url, schema):
            await replay(url, conversations)
            kinds, extra["sessions_table"] = await postgres_bytes(schema)
    else:
        async with redis_url() as (url, namespace):
            await replay(url, conversations)
            kinds = await redis_bytes(namespace)
    exchanges = sum(len(c.pairs) for c in conversations)
    raw = sum(c.raw_bytes for c in conversations)
    total = sum(kinds.values())
    traces = sum(v for k, v in kinds.items() if k.startswith("trace"))
    return {
        "exchanges": exchanges,
        "raw_text_bytes": raw,
        "total_bytes": total,
        "per_exchange": round(total / exchanges),
        "ratio_to_raw": round(total / raw, 1),
        "trace_share": round(traces / total, 3),
        "traces_per_exchange": round(traces / exchanges),
        "by_kind_per_exchange": {k: round(v / exchanges) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
        **extra,
    }


def _print(backend: str, result: dict[str, Any]) -> None:
    print(f"{backend:9} {result['exchanges']} exchanges, raw text {result['raw_text_bytes'] / 1024:.0f} KB:"
          f" {result['total_bytes'] / 1024:.0f} KB kept, {result['per_exchange']} B per exchange"
          f" ({result['ratio_to_raw']}x the raw text), traces {result['trace_share']:.0%}")
    print("          per exchange: " + ", ".join(f"{k} {v}" for k, v in result["by_kind_per_exchange"].items()))
    for name, c in result.get("codecs", {}).items():
        print(f"          {name:28} {c['bytes'] / 1024:8.0f} KB  pack {c['pack_us']:7.1f} us  unpack {c['unpack_us']:6.1f} us")
    if "sessions_table" in result:
        print(f"          sessions table: {result['sessions_table']}")


async def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data",
                        help="the evaluation data folder (holds locomo/ and cped/)")
    parser.add_argument("--exchanges", type=int, default=200, help="exchanges per conversation")
    parser.add_argument("--conversations", type=int, default=1, help="LoCoMo conversations (of 5)")
    parser.add_argument("--backends", default="sqlite,postgres,redis")
    args = parser.parse_args(argv)
    sets = {
        "locomo": locomo(args.data / "locomo" / "locomo_dev.json", args.conversations, args.exchanges),
        "zh": [cped(args.data / "cped" / "valid_split.csv", args.exchanges)],
    }
    results: dict[str, Any] = {}
    for backend in args.backends.split(","):
        for name, conversations in sets.items():
            try:
                result = await measure(backend, conversations)
            except (ImportError, OSError) as exc:
                print(f"{backend}: skipped ({exc})")
                break
            results[f"{backend}:{name}"] = result
            _print(f"{backend}:{name}", result)
    return results


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main()), ensure_ascii=False))
