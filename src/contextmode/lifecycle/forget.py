"""Forget: erase a session, every session of a user, or a whole tenant, and say what went.

A forget is resumable and idempotent. It first opens a deletion record in the
store (or finds the unfinished one for the same scope and target), then erases
the sessions one by one, each in one store transaction that also adds its
counts to the record, and finally marks the record finished. A crash leaves an
unfinished record: `resume_forgets` (``contextmode forget --resume``, and every
service worker at start) runs it again; sessions already erased count zero.

Besides the store, a forget clears what this process holds of each session
(`LocalCaches`: recall indexes, pending jobs, computed summaries) and the image
temp files its turns name; other workers clear theirs when their
`ForgetWatcher` sees the deletion record (docs/lifecycle.md).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Protocol, TypeGuard, runtime_checkable

from .._protocols import implements
from ..errors import ConfigError, StoreError
from ..store.base import Store
from ..store.lifecycle import (
    DeletionRecord,
    LifecycleStore,
    Scope,
    is_lifecycle_store,
    merge_counts,
)
from ..types import SessionKey, validate_id

__all__ = ["LocalCaches", "PendingWrites", "forget", "lifecycle_store", "resume_forgets", "settle_writes"]

_PAGE = 200


class LocalCaches(Protocol):
    """Something holding session data in process memory (the `Engine`)."""

    def forget_local(self, key: SessionKey) -> Mapping[str, int]:
        """Drop everything held of the session; counts per kind."""
        ...


@runtime_checkable
class PendingWrites(Protocol):
    """A holder that may still be writing a session's records after its reply (the `Engine`:
    each exchange's trace); an erasure waits for them, so nothing comes back after it."""

    async def settle_writes(self, key: SessionKey) -> None:
        """Return once the session's writes still running are done."""
        ...


def _writes_pending(cache: object) -> TypeGuard[PendingWrites]:
    return implements(cache, PendingWrites)


async def settle_writes(caches: Sequence[LocalCaches], key: SessionKey) -> None:
    """Wait for every write the ``caches`` still run for the session (before erasing it)."""
    for cache in caches:
        if _writes_pending(cache):
            await cache.settle_writes(key)


def lifecycle_store(store: Store) -> LifecycleStore:
    """``store`` as a `LifecycleStore`, or a `ConfigError` naming what it lacks."""
    if not is_lifecycle_store(store):
        raise ConfigError(f"{type(store).__name__} cannot list users or erase with an audit record")
    return store


async def _session_ids(store: LifecycleStore, tenant: str, scope: Scope, target: str) -> AsyncIterator[str]:
    """The sessions to erase; erased ones leave the listing, so page 0 is read until empty."""
    if scope == "session":
        yield target
        return
    user_id = target if scope == "user" else None
    seen: set[str] = set()
    while True:
        page = await store.list_sessions(tenant, limit=_PAGE, user_id=user_id)
        fresh = [info.session_id for info in page if info.session_id not in seen]
        if not fresh:
            if page:
                raise StoreError(f"sessions of {scope} {target!r} are still listed after erasure")
            return
        for session_id in fresh:
            seen.add(session_id)
            yield session_id


async def _erase_images(store: Store, key: SessionKey, image_dir: Path) -> int:
    """Delete image temp files the session's turns name (a crash can leave one behind).

    Only files directly inside ``image_dir`` are touched, whatever a turn's metadata says.
    """
    info = await store.info(key)
    if info is None:
        return 0
    folder = image_dir.resolve()
    erased = 0
    for start in range(1, info.last_seq + 1, 500):
        for turn in await store.turns(key, from_seq=start, to_seq=start + 499):
            for image in turn.metadata.get("images") or ():
                path = Path(str(image.get("path", ""))) if isinstance(image, dict) else None
                if path is None or path.resolve().parent != folder:
                    continue
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                    erased += 1
    return erased


async def _run(
    store: LifecycleStore, record: DeletionRecord, caches: Sequence[LocalCaches], image_dir: Path | None
) -> DeletionRecord:
    local: dict[str, int] = {"images": 0}
    async for session_id in _session_ids(store, record.tenant, record.scope, record.target):
        key = SessionKey(record.tenant, session_id)
        if image_dir is not None:
            local["images"] += await _erase_images(store, key, image_dir)
        await settle_writes(caches, key)
        for cache in caches:
            merge_counts(local, cache.forget_local(key))
        await store.erase_session(key, record_id=record.id)
        for cache in caches:  # a job that was mid-write may have re-filled a cache
            merge_counts(local, cache.forget_local(key))
    await store.compact()
    return await store.finish_deletion(record.id, local)


async def forget(
    store: Store,
    tenant: str,
    scope: Scope,
    target: str,
    *,
    actor: str = "library",
    caches: Sequence[LocalCaches] = (),
    image_dir: Path | None = None,
) -> DeletionRecord:
    """Erase ``target`` (a session id, a user id, or the tenant itself) and return the
    finished deletion record with the counts per kind.

    Idempotent: forgetting what is already gone returns a record with zero counts.
    """
    lifecycle = lifecycle_store(store)
    validate_id(tenant, "tenant")
    if scope == "tenant":
        target = tenant
    elif scope in ("session", "user"):
        validate_id(target, "session id" if scope == "session" else "user id")
    else:
        raise ConfigError(f"cannot forget by {scope!r}: use session, user or tenant")
    record = await lifecycle.open_deletion(tenant, scope, target, actor=actor)
    return await _run(lifecycle, record, caches, image_dir)


async def resume_forgets(
    store: Store, *, caches: Sequence[LocalCaches] = (), image_dir: Path | None = None
) -> list[DeletionRecord]:
    """Finish every forget a crash cut off; return their finished records."""
    lifecycle = lifecycle_store(store)
    done = []
    for record in await lifecycle.deletions(pending_only=True, limit=10_000):
        if record.scope in ("session", "user", "tenant"):
            done.append(await _run(lifecycle, record, caches, image_dir))
    return done
