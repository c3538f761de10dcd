"""Redis side of the lifecycle abilities (`store.lifecycle.Lifecycle`), mixed into `RedisDriver`.

Erasing a session is one Lua script (`_redis_scripts.ERASE`): it deletes the
session hash and one key per registered kind (`REDIS_SESSION_KEYS`), updates
the indexes and adds the counts to the deletion record, atomically.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any

from ...errors import StoreError
from .._codec import from_micros, now_micros, to_micros
from ..lifecycle import DeletionRecord, Scope, UserInfo
from ..postings import KeptHeads

__all__ = ["RedisLifecycle"]


def _record(record_id: int, raw: Mapping[str, str]) -> DeletionRecord:
    finished = raw.get("finished_at")
    return DeletionRecord(
        id=record_id, tenant=raw["tenant"], scope=raw["scope"],  # type: ignore[arg-type]
        target=raw["target"], actor=raw["actor"], started_at=from_micros(int(raw["started_at"])),
        finished_at=from_micros(int(finished)) if finished else None,
        counts={k[2:]: int(v) for k, v in raw.items() if k.startswith("c:")},
    )


class RedisLifecycle:
    """Users, erasure, the deletion log and restore for `RedisDriver`."""

    namespace: str
    _heads: KeptHeads

    def _guard(self) -> AbstractAsyncContextManager[Any]:
        raise NotImplementedError  # RedisDriver's own

    async def _script(self, name: str, keys: list[str], args: list[Any]) -> Any:
        raise NotImplementedError

    def _keys(self, tenant: str, session_id: str) -> dict[str, str]:
        raise NotImplementedError

    async def _erase(
        self, tenant: str, session_id: str, cutoff: int | str, record: str = ""
    ) -> dict[str, int]:
        raise NotImplementedError

    async def list_users(self, tenant: str, *, limit: int = 100, offset: int = 0) -> list[UserInfo]:
        if limit <= 0:
            return []
        ns = self.namespace
        async with self._guard() as client:
            users = await client.zrevrange(f"{ns}users:{tenant}", offset, offset + limit - 1,
                                           withscores=True)
            async with client.pipeline(transaction=False) as pipe:
                for user, _ in users:
                    pipe.zcard(f"{ns}u:{tenant}/{user}")
                sizes = await pipe.execute()
        return [UserInfo(tenant=tenant, user_id=u, sessions=int(n), updated_at=from_micros(int(t)))
                for (u, t), n in zip(users, sizes, strict=True) if n]

    async def list_tenants(self) -> list[str]:
        prefix = f"{self.namespace}ix:"
        async with self._guard() as client:
            found = {key[len(prefix):] async for key in client.scan_iter(match=f"{prefix}*", count=1000)}
        return sorted(found)

    async def erase_session(
        self, tenant: str, session_id: str, *, record_id: int | None = None
    ) -> dict[str, int]:
        record = "" if record_id is None else f"{self.namespace}del:{record_id}"
        return await self._erase(tenant, session_id, "", record)

    async def erase_turns_before(
        self, tenant: str, session_id: str, seq: int, *, record_id: int | None = None
    ) -> dict[str, int]:
        self._heads.forget((tenant, session_id))  # its last turn, kept for the next append
        k = self._keys(tenant, session_id)
        record = "" if record_id is None else f"{self.namespace}del:{record_id}"
        turns, scores = await self._script(
            "ERASE_BEFORE", [k["sess"], k["turns"], k["emo"]], [seq, record]
        )
        return {"turns": int(turns), "emotion_scores": int(scores)}

    async def compact(self) -> None:
        return None  # a deleted key is gone from memory; persistence files are rewritten by Redis

    async def open_deletion(
        self, tenant: str, scope: Scope, target: str, *, actor: str
    ) -> DeletionRecord:
        ns = self.namespace
        record_id = int(await self._script(
            "OPEN_DELETION",
            [f"{ns}del:seq", f"{ns}del:open:{tenant}/{scope}/{target}", f"{ns}deletions"],
            [f"{ns}del:", tenant, scope, target, actor, now_micros()],
        ))
        return await self._read_record(record_id)

    async def _read_record(self, record_id: int) -> DeletionRecord:
        async with self._guard() as client:
            raw = await client.hgetall(f"{self.namespace}del:{record_id}")
        if not raw:
            raise StoreError(f"no deletion record {record_id}")
        return _record(record_id, raw)

    async def finish_deletion(self, record_id: int, extra: Mapping[str, int]) -> DeletionRecord:
        record = await self._read_record(record_id)
        ns = self.namespace
        args: list[Any] = [record_id, now_micros()]
        for kind, count in extra.items():
            args += [kind, int(count)]
        await self._script(
            "FINISH_DELETION",
            [f"{ns}del:{record_id}", f"{ns}del:open:{record.tenant}/{record.scope}/{record.target}"],
            args,
        )
        return await self._read_record(record_id)

    async def deletions(
        self, *, since_id: int = 0, pending_only: bool = False, limit: int = 100
    ) -> list[DeletionRecord]:
        out: list[DeletionRecord] = []
        async for record in self._records(since_id):
            if record.pending or not pending_only:
                out.append(record)
                if len(out) >= limit:
                    break
        return out

    async def _records(self, since_id: int) -> AsyncIterator[DeletionRecord]:
        ns = self.namespace
        while True:
            async with self._guard() as client:
                ids = await client.zrangebyscore(f"{ns}deletions", f"({since_id}", "+inf",
                                                 start=0, num=200)
                async with client.pipeline(transaction=False) as pipe:
                    for record_id in ids:
                        pipe.hgetall(f"{ns}del:{record_id}")
                    raws = await pipe.execute()
            for record_id, raw in zip(ids, raws, strict=True):
                if raw:
                    yield _record(int(record_id), raw)
            if len(ids) < 200:
                return
            since_id = int(ids[-1])

    async def restore_session(
        self, tenant: str, session_id: str, *, user_id: str | None,
        created_at: datetime, updated_at: datetime,
    ) -> bool:
        k = self._keys(tenant, session_id)
        updated = to_micros(updated_at)
        async with self._guard() as client:
            if not await client.exists(k["sess"]):
                return False
            fields: dict[str, Any] = {"created_at": to_micros(created_at), "updated_at": updated}
            if user_id is not None:
                fields["user_id"] = user_id
            async with client.pipeline(transaction=True) as pipe:
                pipe.hset(k["sess"], mapping=fields)
                pipe.zadd(k["ix"], {session_id: updated})
                pipe.zadd(k["idle"], {k["member"]: updated})
                if user_id is not None:
                    pipe.zadd(f"{k['user_prefix']}{user_id}", {session_id: updated})
                    pipe.zadd(k["users"], {user_id: updated}, gt=True)
                await pipe.execute()
        return True
