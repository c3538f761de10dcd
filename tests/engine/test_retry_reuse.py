"""A message retried after its model failed reuses its stored user turn (`TurnRequest.retry_window_s`):
within the window, for the same text, when it was never answered; otherwise it is a new turn."""

from __future__ import annotations

from datetime import timedelta

from contextmode.engine import TurnRequest
from contextmode.errors import ModelError
from contextmode.testing.models import ScriptedModel
from contextmode.types import SessionKey, utc_now
from tests.engine.test_engine import make_engine

KEY = SessionKey("t", "retry")


async def _turn(engine: object, message: str, **options: object) -> str:
    request = TurnRequest(key=KEY, message=message, retry_window_s=600, **options)  # type: ignore[arg-type]
    try:
        return (await engine.turn(request)).answer  # type: ignore[attr-defined]
    except ModelError:
        return "<failed>"


async def test_a_retry_of_a_failed_message_reuses_its_turn_and_its_context_holds_it_once() -> None:
    model = ScriptedModel([ModelError("429"), ModelError("429"), "answer"])
    engine = make_engine(model)
    assert [await _turn(engine, "hi") for _ in range(3)] == ["<failed>", "<failed>", "answer"]
    turns = await engine.store.turns(SessionKey("t", "retry"))
    assert [(t.role, t.content) for t in turns] == [("user", "hi"), ("assistant", "answer")]
    assert [m.content for m in model.calls[-1].messages if m.role == "user"] == ["hi"]  # not twice in the context


async def test_an_answered_message_or_one_past_the_window_is_a_new_turn() -> None:
    engine = make_engine(ScriptedModel(["one", "two", ModelError("down"), "three"]))
    await _turn(engine, "ok")
    await _turn(engine, "ok")  # the same words again after an answer: a new turn
    await _turn(engine, "late")
    await _turn(engine, "late", now=utc_now() + timedelta(hours=1))  # past the window: stored again
    turns = await engine.store.turns(SessionKey("t", "retry"))
    assert [t.content for t in turns] == ["ok", "one", "ok", "two", "late", "late", "three"]
