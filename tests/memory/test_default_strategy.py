"""The shipped default: recall of older turns in every entry point, recent turns take its share back."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from typer.testing import CliRunner

from contextmode.api import ContextMode, build_engine
from contextmode.cli.app import app
from contextmode.memory import DefaultStrategy, get_strategy
from contextmode.settings import EngineSettings
from contextmode.store.memory import MemoryStore
from contextmode.testing.counters import CharTokenCounter
from contextmode.testing.models import FunctionModel
from contextmode.types import SessionState, Summary, Turn

T0 = datetime(2024, 3, 1, 9, 0, tzinfo=UTC)
_FILLER = [
    "The weather was grey all day so I stayed in and tidied the flat.",
    "Work has been busy, lots of meetings about the quarterly report.",
    "Traffic was terrible this morning, the bus was twenty minutes late.",
    "We watched a documentary about whales last night, pretty relaxing.",
]


def _turn(seq: int, content: str) -> Turn:
    return Turn(seq=seq, role="user" if seq % 2 else "assistant", content=content, tokens=len(content),
                created_at=T0 + timedelta(minutes=seq))


def test_the_shipped_default_is_the_recall_strategy() -> None:
    assert EngineSettings().strategy == "default"
    assert EngineSettings.from_env({}).strategy == "default"
    strategy = get_strategy("default")
    assert isinstance(strategy, DefaultStrategy) and strategy.recall_limit > 0


def test_recent_layer_takes_back_what_recall_does_not_use() -> None:
    turns = tuple(_turn(i, _FILLER[i % 4]) for i in range(11, 31))
    state = SessionState(tenant="t", session_id="s", turns=turns, last_seq=30,
                         summary=Summary(text="earlier", covers_seq=10, tokens=2))
    strategy = get_strategy("default")
    plan = strategy.plan(state, "anything", now=T0)
    # Nothing recalled: every uncovered turn is a recent candidate, one unbroken stretch.
    assert [t.seq for t in plan.recent] == list(range(11, 31))
    assert plan.recall == ()
    recalled = SessionState(**{**state.__dict__, "recalled": (turns[5], turns[2])})
    plan = strategy.plan(recalled, "anything", now=T0)
    # Turns 16 and 13 are shown by recall: the recent stretch stops before 16, no repeats.
    assert [t.seq for t in plan.recall] == [16, 13]
    assert [t.seq for t in plan.recent] == list(range(17, 31))


async def test_every_engine_built_by_default_recalls_old_turns() -> None:
    engine = build_engine(store=MemoryStore(), model=FunctionModel(lambda m: "ok"),
                          counter=CharTokenCounter(),
                          settings=EngineSettings(context_window=4000, summary_threshold=1000))
    await engine.record("local", "s", "user", "My sister Marmalade lives in Lisbon and teaches piano.")
    await engine.record("local", "s", "assistant", "That sounds lovely.")
    # More than the 3,000-token input budget holds: the old turn is reached by recall.
    for i in range(300):
        await engine.record("local", "s", "user" if i % 2 == 0 else "assistant", _FILLER[i % 4])
    await engine.drain()
    prepared = await engine.prepare("local", "s", "Where does my sister Marmalade live?")
    recall = prepared.context.layer("recall")
    assert recall is not None and 1 in {item.seq for item in recall.items}
    # A message that matches nothing old: no recall layer, the recent turns use the budget.
    prepared = await engine.prepare("local", "s", "quantum entanglement photon experiments")
    assert prepared.context.layer("recall") is None
    assert len(prepared.context.layer("recent").items) > get_strategy("default").recent_turns  # type: ignore[union-attr]
    await engine.close()


def test_context_mode_uses_the_default_with_recall(tmp_path: object) -> None:
    # A window smaller than the conversation: the old turn is reached by recall.
    settings = EngineSettings(context_window=360)
    with ContextMode(store="memory://", model=FunctionModel(lambda m: "ok"), counter=CharTokenCounter(),
                     settings=settings) as cm:
        assert cm.engine.settings.strategy == "default" and cm.engine.recaller is not None
        cm.chat("s", "I keep my spare keys under the blue flowerpot by the door.")
        for i in range(12):
            cm.chat("s", _FILLER[i % 4])
        ctx = cm.context("s", "where are my spare keys?")
        assert ctx.strategy == "default"
        recall = ctx.layer("recall")
        assert recall is not None and 1 in {item.seq for item in recall.items}


def test_inspect_says_why_a_turn_was_recalled(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cm.db'}"
    with ContextMode(store=url, model=FunctionModel(lambda m: "ok"), counter=CharTokenCounter(),
                     settings=EngineSettings(context_window=360)) as cm:
        cm.chat("s", "I keep my spare keys under the blue flowerpot by the door.")
        for i in range(12):
            cm.chat("s", _FILLER[i % 4])
    window = {"CONTEXTMODE_CONTEXT_WINDOW": "360"}
    out = CliRunner().invoke(app, ["inspect", "s", "--store", url, "-m", "where are my spare keys?", "--json"],
                             env=window)
    assert out.exit_code == 0, out.output
    recalled = json.loads(out.output.strip().splitlines()[-1])["recalled"]
    first = next(r for r in recalled if r["seq"] == 1)
    assert {"spar", "key"} <= set(first["matched"])  # stemmed terms and first["score"] > 0
    text = CliRunner().invoke(app, ["inspect", "s", "--store", url, "-m", "where are my spare keys?"], env=window)
    assert "recalled turn 1: score" in text.output and "spar" in text.output


def test_following_turns_come_in_only_when_asked_for() -> None:
    from contextmode.memory.recall.recaller import RecallHit, _with_neighbours

    hits = [RecallHit(seq=10, score=2.0), RecallHit(seq=20, score=1.0)]
    plain = _with_neighbours(hits, 0.5)
    assert [(h.seq, h.neighbour_of) for h in plain] == [(10, None), (20, None), (9, 10), (19, 20)]
    both = _with_neighbours(hits, 0.5, 0.4)
    assert [(h.seq, h.neighbour_of) for h in both] == [
        (10, None), (20, None), (9, 10), (11, 10), (19, 20), (21, 20)
    ]
    assert both[3].score == 0.8
