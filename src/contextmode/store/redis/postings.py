"""The recall index in Redis (see `store.postings`), mixed into `RedisDriver`.

Keys of one session (``P`` = namespace + ``tenant/session_id``): ``{ns}rp:P``, a
hash ``block:term`` → packed postings (`postings.POSTING` records, appended by
the APPEND script in the same script run as the turns they index), and
``{ns}ri:P``, a hash of the index statistics (``indexed_seq``, ``docs``,
``total_len``) and of each term's document frequency (``df:term``). Packed
postings are bytes, so they are read through a second client that does not
decode replies.

An append needs the turn before its first one (document expansion) and the
index state before it can compute postings: it reads both (INDEX_HEAD), then
runs APPEND with the ``last_seq`` it assumed; if another writer moved the
session in between, APPEND writes nothing and the append is computed again. After
an append, what the next append of the session would read is kept in this process
(`postings.KeptHeads`), so a worker that keeps writing one session skips that read:
APPEND checks the assumed ``last_seq`` and the SHA-1 of that turn's JSON, so a stale
entry (another worker wrote, or the session was deleted and re-created) is caught and
costs one redo.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from ...types import NewTurn, Turn
from ..postings import POSTING, IndexHead, IndexStats, KeptHeads, PostingRows, postings_for
from . import scripts as lua
from .rows import decode_turn

__all__ = ["IndexHead", "RedisPostings", "index_args", "index_rows"]


def _sha1(doc: str) -> str:
    return hashlib.sha1(doc.encode()).hexdigest() if doc else ""


def index_args(rows: PostingRows, indexed_seq: int) -> list[Any]:
    """Script arguments for ``rows``: new indexed_seq, docs, length (an exact decimal
    string), then the rows in three strings: ``block term-bytes postings`` triples, the
    terms and the packed postings, each concatenated in row order (a few arguments to
    encode and parse whatever the number of rows)."""
    meta, names = [], []
    for term, block, data in rows.rows:
        name = term.encode()
        names.append(name)
        meta.append(f"{block} {len(name)} {len(data) // POSTING.itemsize}")
    return [indexed_seq, rows.docs, repr(float(rows.length)), " ".join(meta), b"".join(names),
            b"".join(data for _, _, data in rows.rows)]


def index_rows(head: IndexHead, turns: Sequence[NewTurn], analyzed: Mapping[str, list[str]]) -> list[Any]:
    """APPEND's index arguments after ``head``: ``assumed last_seq``, the digest, then
    `index_args` (``['']`` = none)."""
    if not head.writes_index:
        return [""]
    numbered = head.numbered(turns)
    added = postings_for(numbered, head.previous, analyzed=analyzed)
    return [head.last, head.digest, *index_args(added, head.last + len(numbered))]


class RedisPostings:
    """`PostingsStore` for `RedisDriver` (see the module docstring)."""

    namespace: str
    url: str
    _raw_client: Any
    _postings_script: Any
    _query_script: Any
    _heads: KeptHeads
    """What the next append of a session needs, as this process last wrote it."""

    def _guard(self) -> AbstractAsyncContextManager[Any]:
        raise NotImplementedError  # RedisDriver's own

    async def _script(self, name: str, keys: list[str], args: list[Any]) -> Any:
        raise NotImplementedError

    def _keys(self, tenant: str, session_id: str) -> dict[str, str]:
        raise NotImplementedError

    async def turns(
        self, tenant: str, session_id: str, *, from_seq: int = 1, to_seq: int | None = None
    ) -> list[Turn]:
        raise NotImplementedError

    @asynccontextmanager
    async def _raw(self) -> AsyncIterator[Any]:
        """A client whose replies stay bytes (packed postings), errors mapped like `_guard`."""
        async with self._guard():
            if self._raw_client is None:
                import redis.asyncio as aioredis
                from redis.asyncio.retry import Retry
                from redis.backoff import NoBackoff
                from redis.exceptions import ConnectionError as LostConnection

                # Reads only, so a connection found dead (the server restarted since this
                # client last spoke) is retried once on a new one.
                self._raw_client = aioredis.Redis.from_url(
                    self.url, decode_responses=False,
                    retry=Retry(NoBackoff(), 1), retry_on_error=[LostConnection],
                )
                self._postings_script = self._raw_client.register_script(lua.POSTINGS)
                self._query_script = self._raw_client.register_script(lua.QUERY_POSTINGS)
            yield self._raw_client

    async def _close_raw(self) -> None:
        if self._raw_client is not None:
            await self._raw_client.aclose()
            self._raw_client = None

    async def index_head(self, k: dict[str, str], key: tuple[str, str]) -> IndexHead:
        """What an append after the session's last turn needs: kept by this process's last
        append of it, else read in one script."""
        kept = self._heads.take(key)
        if kept is not None:
            return kept
        last, doc, indexed = await self._script("INDEX_HEAD", [k["sess"], k["turns"], k["rindex"]], [])
        previous = decode_turn(int(last), doc, None) if doc else None
        return IndexHead(int(last), previous, None if indexed is None else int(indexed), _sha1(doc or ""))

    def head_after(
        self, key: tuple[str, str], before: int, turns: Sequence[NewTurn], doc: str, indexed: bool
    ) -> None:
        """Keep what the next append needs after ``turns`` were appended after seq ``before``
        (``doc``: the last one's stored JSON; ``indexed``: APPEND wrote their postings; if it
        did not, the entry says "no index" and APPEND decides again)."""
        self._heads.keep(key, before, turns, indexed=indexed, digest=_sha1(doc), size=len(doc))

    async def index_stats(self, tenant: str, session_id: str) -> IndexStats:
        k = self._keys(tenant, session_id)
        async with self._guard() as client:
            row = await client.hmget(k["rindex"], ["indexed_seq", "docs", "total_len"])
        if row[0] is None:
            return IndexStats()
        return IndexStats(indexed_seq=int(row[0]), docs=int(row[1] or 0),
                          total_len=float(row[2] or 0.0), exists=True)

    async def postings(
        self, tenant: str, session_id: str, terms: Sequence[str], *, from_block: int = 0
    ) -> dict[str, list[tuple[int, bytes]]]:
        k = self._keys(tenant, session_id)
        out: dict[str, list[tuple[int, bytes]]] = {}
        if not terms:
            return out
        async with self._raw():
            flat = await self._postings_script(
                keys=[k["rpostings"], k["rindex"]], args=[from_block, *terms]
            )
        for i in range(0, len(flat), 3):
            out.setdefault(flat[i].decode(), []).append((int(flat[i + 1]), bytes(flat[i + 2])))
        return out

    async def query_postings(
        self, tenant: str, session_id: str, terms: Mapping[str, int], *,
        capped: Mapping[str, int], cap: int, most: int,
    ) -> tuple[dict[str, list[tuple[int, bytes]]], dict[str, int]]:
        k = self._keys(tenant, session_id)
        out: dict[str, list[tuple[int, bytes]]] = {}
        counts: dict[str, int] = {}
        wanted = {**capped, **terms}
        if not wanted:
            return out, counts
        args: list[Any] = [cap, most]
        for term, start in wanted.items():
            args += [term, start, 0 if term in terms else 1]
        async with self._raw():
            flat = await self._query_script(keys=[k["rpostings"], k["rindex"]], args=args)
        for i in range(0, len(flat), 3):
            term, block = flat[i].decode(), int(flat[i + 1])
            if block < 0:
                counts[term] = int(flat[i + 2])
            else:
                out[term] = [(block, bytes(flat[i + 2]))]
        return out, counts

    async def term_counts(self, tenant: str, session_id: str, terms: Sequence[str]) -> dict[str, int]:
        k = self._keys(tenant, session_id)
        wanted = list(dict.fromkeys(terms))
        if not wanted:
            return {}
        async with self._guard() as client:
            counts = await client.hmget(k["rindex"], [f"df:{t}" for t in wanted])
        return {t: int(c) for t, c in zip(wanted, counts, strict=True) if c is not None}

    async def index_backfill(self, tenant: str, session_id: str, *, batch: int = 2000) -> int:
        k = self._keys(tenant, session_id)
        keys = [k["sess"], k["rpostings"], k["rindex"]]
        while True:
            async with self._guard() as client:
                last = await client.hget(k["sess"], "last_seq")
                indexed = await client.hget(k["rindex"], "indexed_seq")
            if last is None:
                return 0
            done = int(indexed or 0)
            if done >= int(last):
                if indexed is None:  # an empty log: the index exists from now on
                    await self._script("BACKFILL", keys, ["", done, 0, "0.0"])
                return 0
            turns = await self.turns(tenant, session_id, from_seq=done + 1, to_seq=done + batch)
            if not turns:
                return 0
            before = await self.turns(tenant, session_id, from_seq=done, to_seq=done) if done else []
            added = postings_for(turns, before[0] if before else None)
            args = ["" if indexed is None else indexed, *index_args(added, turns[-1].seq)]
            if await self._script("BACKFILL", keys, args):
                return len(turns)
            # Another catch-up of this session wrote first: read its state again.

    async def sessions_to_index(self, *, limit: int = 1000) -> list[tuple[str, str, int, int]]:
        out: list[tuple[str, str, int, int]] = []
        async with self._guard() as client:
            members = await client.zrange(f"{self.namespace}idle", 0, -1)
            for start in range(0, len(members), 500):
                part = [m.partition("/") for m in members[start : start + 500]]
                async with client.pipeline(transaction=False) as pipe:
                    for tenant, _, sid in part:
                        k = self._keys(tenant, sid)
                        pipe.hget(k["sess"], "last_seq")
                        pipe.hget(k["rindex"], "indexed_seq")
                    replies = await pipe.execute()
                for (tenant, _, sid), last, done in zip(part, replies[::2], replies[1::2], strict=True):
                    if last is not None and (done is None or int(done) < int(last)):
                        out.append((tenant, sid, int(done or 0), int(last)))
                        if len(out) >= limit:
                            return out
        return out
