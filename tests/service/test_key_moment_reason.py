"""The inspector's context says why a turn is a key moment: its intensity over the threshold."""

from __future__ import annotations

from contextmode.api import build_engine
from contextmode.service.schemas import ContextOut


async def test_key_moment_items_carry_their_emotion_and_the_threshold() -> None:
    engine = build_engine(store="memory://", processors="offline")
    try:
        await engine.record("t", "s", "user", "I'm devastated, my father died and I can't stop crying!!")
        for i in range(14):
            await engine.record("t", "s", "assistant", f"I see, go on ({i}).")
            await engine.record("t", "s", "user", f"We talked about the weather ({i}).")
        await engine.drain()
        prepared = await engine.prepare("t", "s", "What should I do now?", strategy="hybrid")
    finally:
        await engine.close()
    out = ContextOut.of(prepared, full=True)
    layers = {layer.name: layer for layer in out.layers}
    key = layers["key_moments"]
    assert key.threshold == 0.7
    assert key.content, "the grieving turn is older than the recent window and should be a key moment"
    first = key.content[0]
    assert first.seq == 1 and first.emotion is not None and first.emotion > 0.7
    # Other layers do not carry the reason.
    assert all(item.emotion is None for item in layers["recent"].content or [])
    assert layers["recent"].threshold is None
