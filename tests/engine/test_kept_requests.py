"""Each exchange's usage reads what the previous exchange's trace kept (its request, the session's
money so far): remembered by the process that kept it (`KeptRequests`), read from the store
otherwise, with the same figures either way."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from contextmode.engine import Engine, TurnRequest
from contextmode.engine.usage import KeptRequests, UsageBasis
from contextmode.store.memory import MemoryStore
from contextmode.store.records import TurnTrace, TurnUsage
from contextmode.testing.models import FunctionModel
from contextmode.types import ChatMessage, SessionKey
from tests.service.test_service import make_engine

SAID = ["I keep bees on my roof in Lyon.", "What should I plant for them?", "And in the shade?",
        "How often do I check the hives?", "我五月要去成都，预算两千。", "那边天气怎么样？"]


def _answer(messages: Sequence[ChatMessage]) -> str:
    return f"About {messages[-1].content[:24]}: a short answer."


class _Forgetful(KeptRequests):
    """Remembers nothing: every exchange reads the previous trace from the store."""

    def basis(self, *args: object, **kwargs: object) -> UsageBasis | None:
        self.asked = getattr(self, "asked", 0) + 1
        return None


async def _usages(engine: Engine, session: str, said: Sequence[str]) -> list[TurnUsage | None]:
    key = SessionKey("t", session)
    for text in said:
        await engine.turn(TurnRequest(key=key, message=text))
    await engine.drain()
    traces = [await engine.trace(SessionKey("t", session), n) for n in range(1, len(said) + 1)]
    return [t.usage for t in traces]


def _engine(**settings: object) -> Engine:
    return make_engine(FunctionModel(_answer, name="gpt-5-mini"), store=MemoryStore(), context_window=4000,
                       **settings)


@pytest.mark.parametrize("order", ["default", "cache_first"])
async def test_remembered_and_read_back_give_the_same_usage(order: str) -> None:
    remembering, reading = _engine(order=order), _engine(order=order)
    forgetful = _Forgetful()
    reading.kept_requests = forgetful
    try:
        remembered = await _usages(remembering, "s", SAID)
        read = await _usages(reading, "s", SAID)
    finally:
        await remembering.close()
        await reading.close()
    assert forgetful.asked == len(SAID) - 1  # the second engine read every previous trace
    assert remembered == read
    assert all(u is not None and u.session_usd is not None for u in remembered)
    assert any(u is not None and u.cacheable_tokens for u in remembered[1:])


async def test_the_usual_turn_does_not_read_the_previous_trace() -> None:
    engine = _engine()
    reads: list[int] = []
    keeper = engine.store
    assert isinstance(keeper, MemoryStore)
    original = keeper.get_trace

    async def counted(key: SessionKey, turn: int) -> TurnTrace | None:
        reads.append(turn)
        return await original(key, turn)

    keeper.get_trace = counted  # type: ignore[method-assign]
    try:
        await _usages(engine, "s", SAID[:3])
        assert reads == [1, 2, 3]  # only the test's own reads of the kept traces
        # Erased and started again: the first exchange of the new session is turn 1 again, and
        # what was remembered of the old one is gone.
        await engine.store.delete(SessionKey("t", "s"))
        reads.clear()
        again = await _usages(engine, "s", SAID[3:5])
        assert reads == [1, 2]
        assert again[0] is not None and again[0].cacheable_tokens == 0
    finally:
        await engine.close()


def test_a_basis_is_used_only_for_the_exchange_right_after_in_the_same_session_and_store() -> None:
    from datetime import UTC, datetime

    from contextmode.store.records import TurnTrace

    kept = KeptRequests()
    key = SessionKey("t", "s")
    created = datetime(2026, 1, 1, tzinfo=UTC)
    store, other = object(), object()
    trace = TurnTrace(turn=3, user_seq=5, answer_seq=6, created_at=created, typed="hi", sent="hi", messages=(
        ChatMessage(role="user", content="hi"),))
    kept.keep(key, store, trace, last_seq=6, session_created=created)
    basis = kept.basis(key, store, turn=4, user_seq=7, session_created=created)
    assert basis is not None and basis.request is not None and "hi" in basis.request
    assert kept.basis(key, other, turn=4, user_seq=7, session_created=created) is None  # another store
    assert kept.basis(key, store, turn=5, user_seq=7, session_created=created) is None  # not the next exchange
    assert kept.basis(key, store, turn=4, user_seq=9, session_created=created) is None  # turns in between
    assert kept.basis(key, store, turn=4, user_seq=7, session_created=datetime.now(UTC)) is None  # made again
    assert kept.basis(SessionKey("t", "x"), store, turn=4, user_seq=7, session_created=created) is None
    assert kept.forget("t", "s") and kept.basis(key, store, turn=4, user_seq=7, session_created=created) is None
