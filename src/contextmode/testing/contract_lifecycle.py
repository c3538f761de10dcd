"""The lifecycle contract every backend runs: users, erasure counts, the deletion log, restore.

```python
class TestMyLifecycle(LifecycleContract):
    @pytest.fixture
    async def store(self): ...
```
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from ..errors import InputError
from ..store.base import IdempotencyRecord, IdempotencyRecords, Store
from ..store.lifecycle import LifecycleStore, is_lifecycle_store
from ..types import Constraint, SessionKey, Summary
from .contract import new_turns

__all__ = ["LifecycleContract"]

_T = "tenant-l"


def _lifecycle(store: Store) -> LifecycleStore:
    assert is_lifecycle_store(store)
    return store


class LifecycleContract:
    """Behaviour of `store.lifecycle.Lifecycle` every backend guarantees."""

    async def test_a_session_names_its_user_once(self, store: Store) -> None:
        life = _lifecycle(store)
        await store.append(SessionKey(_T, "s1"), new_turns(2), user_id="u1")
        await store.append(SessionKey(_T, "s1"), new_turns(1, start=3))  # no user named: fine
        await store.append(SessionKey(_T, "s2"), new_turns(1), user_id="u1")
        await store.append(SessionKey(_T, "s3"), new_turns(1), user_id="u2")
        await store.append(SessionKey(_T, "s4"), new_turns(1))
        with pytest.raises(InputError):
            await store.append(SessionKey(_T, "s1"), new_turns(1, start=4), user_id="u2")
        assert (await store.info(SessionKey(_T, "s1"))).user_id == "u1"  # type: ignore[union-attr]
        assert (await store.version(SessionKey(_T, "s1"))).last_seq == 3  # the refused append wrote nothing
        mine = await store.list_sessions(_T, user_id="u1")
        assert sorted(i.session_id for i in mine) == ["s1", "s2"]
        assert all(i.user_id == "u1" for i in mine)
        users = await life.list_users(_T)
        assert [(u.user_id, u.sessions) for u in users] == [("u2", 1), ("u1", 2)]
        assert await life.list_users("other") == []
        assert _T in await life.list_tenants()

    async def test_erase_session_counts_every_kind_and_is_idempotent(self, store: Store) -> None:
        life = _lifecycle(store)
        await store.append(SessionKey(_T, "s1"), new_turns(4), user_id="u1")
        await store.set_emotions(SessionKey(_T, "s1"), {1: 0.9, 3: 0.2})
        await store.commit_summary(SessionKey(_T, "s1"), Summary(text="sum", covers_seq=2, tokens=1), expected_version=0)
        pins = [Constraint(key="spice", value="不要辣"), Constraint(key="budget", value="50")]
        await store.commit_constraints(SessionKey(_T, "s1"), pins, expected_version=0)
        await store.record_job(SessionKey(_T, "s1"), "summary", ok=True)
        record = await life.open_deletion(_T, "user", "u1", actor="test")
        counts = await life.erase_session(SessionKey(_T, "s1"), record_id=record.id)
        assert {k: counts[k] for k in ("sessions", "turns", "summaries", "pins", "emotion_scores", "job_stats")} == {
            "sessions": 1, "turns": 4, "summaries": 1, "pins": 2, "emotion_scores": 2, "job_stats": 1}
        assert (await life.erase_session(SessionKey(_T, "s1"), record_id=record.id))["turns"] == 0
        assert await store.info(SessionKey(_T, "s1")) is None
        assert await store.list_sessions(_T, user_id="u1") == []
        assert await life.list_users(_T) == []
        finished = await life.finish_deletion(record.id, {"images": 1})
        assert finished.counts["turns"] == 4 and finished.counts["images"] == 1
        assert not finished.pending

    async def test_erase_session_erases_its_idempotency_records(self, store: Store) -> None:
        life = _lifecycle(store)
        if not isinstance(store, IdempotencyRecords):
            return  # an optional protocol
        answer = '{"answer": "不要辣"}'
        for session, key in (("s1", "k1"), ("s2", "k2")):
            await store.append(SessionKey(_T, session), new_turns(2), user_id="u1")
            assert await store.claim_idempotency(_T, key, "fp", session_id=session, lease_s=60) is None
            await store.finish_idempotency(_T, key, status=200, response=answer, ttl_s=60)
        assert await store.claim_idempotency(_T, "k0", "fp", session_id="s1", lease_s=60) is None  # running
        await store.release_idempotency(_T, "k0")  # released: not counted
        record = await life.open_deletion(_T, "session", "s1", actor="test")
        counts = await life.erase_session(SessionKey(_T, "s1"), record_id=record.id)
        assert counts["idempotency"] == 1
        assert (await life.finish_deletion(record.id, {})).counts["idempotency"] == 1
        # The key is fresh again: a retry runs anew instead of replaying the erased text.
        assert await store.claim_idempotency(_T, "k1", "fp", session_id="s1", lease_s=60) is None
        kept = IdempotencyRecord(fingerprint="fp", status=200, response=answer)
        assert await store.claim_idempotency(_T, "k2", "fp", session_id="s2", lease_s=60) == kept
        assert (await life.erase_session(SessionKey(_T, "s1")))["idempotency"] == 1  # the new running claim
        assert (await life.erase_session(SessionKey(_T, "s1")))["idempotency"] == 0
        assert (await life.erase_session(SessionKey(_T, "s2")))["idempotency"] == 1

    async def test_deletion_log_reuses_the_unfinished_record(self, store: Store) -> None:
        life = _lifecycle(store)
        first = await life.open_deletion(_T, "user", "u9", actor="a")
        again = await life.open_deletion(_T, "user", "u9", actor="b")
        other = await life.open_deletion(_T, "session", "u9", actor="a")
        assert again.id == first.id and other.id != first.id
        assert [r.id for r in await life.deletions(pending_only=True)] == [first.id, other.id]
        await life.finish_deletion(first.id, {})
        assert [r.id for r in await life.deletions(pending_only=True)] == [other.id]
        assert [r.id for r in await life.deletions(since_id=first.id)] == [other.id]
        fresh = await life.open_deletion(_T, "user", "u9", actor="a")
        assert fresh.id not in (first.id, other.id)

    async def test_erase_turns_before_keeps_the_newest(self, store: Store) -> None:
        life = _lifecycle(store)
        await store.append(SessionKey(_T, "s1"), new_turns(10))
        await store.set_emotions(SessionKey(_T, "s1"), {2: 0.9, 9: 0.9})
        counts = await life.erase_turns_before(SessionKey(_T, "s1"), 7)
        assert counts["turns"] == 6 and counts["emotion_scores"] == 1
        assert [t.seq for t in await store.turns(SessionKey(_T, "s1"))] == [7, 8, 9, 10]
        state = await store.load(SessionKey(_T, "s1"), recent=8, key_moments=3)
        assert [t.seq for t in state.turns] == [7, 8, 9, 10] and state.last_seq == 10
        assert (await life.erase_turns_before(SessionKey(_T, "s1"), 7))["turns"] == 0

    async def test_restore_session_sets_owner_and_times(self, store: Store) -> None:
        life = _lifecycle(store)
        created = datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
        updated = datetime(2024, 2, 2, 3, 4, 5, 1, tzinfo=UTC)
        assert not await life.restore_session(SessionKey(_T, "nope"), user_id=None, created_at=created, updated_at=updated)
        await store.append(SessionKey(_T, "s1"), new_turns(1))
        assert await life.restore_session(SessionKey(_T, "s1"), user_id="u5", created_at=created, updated_at=updated)
        info = await store.info(SessionKey(_T, "s1"))
        assert info is not None and (info.user_id, info.created_at, info.updated_at) == ("u5", created, updated)
        assert [u.user_id for u in await life.list_users(_T)] == ["u5"]
