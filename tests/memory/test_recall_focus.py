"""Recall ranking: speaker focus, and pinned facts that give way to recall beyond their share."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from contextmode.assembly import assemble
from contextmode.memory import Budget, allocate, get_strategy
from contextmode.memory.recall import Recaller, RecallHit, RecallSettings
from contextmode.memory.recall.recaller import focus_on_speakers, named_speakers
from contextmode.store.factory import open_store
from contextmode.store.memory import MemoryStore
from contextmode.testing import CharTokenCounter
from contextmode.types import Constraint, NewTurn, SessionKey, SessionState, Turn

T0 = datetime(2024, 3, 1, 9, 0, tzinfo=UTC)


def _turn(seq: int, speaker: str | None, content: str = "x") -> Turn:
    return Turn(seq=seq, role="user", content=content, tokens=1, created_at=T0,
                metadata={"speaker": speaker} if speaker else {})


def test_named_speakers_match_whole_names_and_chinese_substrings() -> None:
    people = {"Melanie", "Caroline", "Mel"}
    assert named_speakers("What does Melanie do to destress?", people) == {"Melanie"}
    assert named_speakers("Did Caroline's friends help?", people) == {"Caroline"}
    assert named_speakers("what did MEL paint", people) == {"Mel"}
    assert named_speakers("How are you?", people) == set()
    assert named_speakers("于春晓说过什么？", {"于春晓", "王小明"}) == {"于春晓"}
    # Addressing a speaker is not asking about them.
    assert named_speakers("Luna, do you remember my sister?", {"Luna", "Tom"}) == set()
    assert named_speakers("Hey Luna! What did Tom say?", {"Luna", "Tom"}) == {"Tom"}
    assert named_speakers("what did I tell you, Luna?", {"Luna", "Tom"}) == set()
    assert named_speakers("王小明，你还记得吗？", {"王小明", "于春晓"}) == set()
    assert named_speakers("Luna, what does Luna like?", {"Luna", "Tom"}) == {"Luna"}


def test_focus_moves_the_named_speakers_turns_up_and_neighbours_follow() -> None:
    turns = {1: _turn(1, "Caroline"), 2: _turn(2, "Melanie"), 3: _turn(3, "Caroline"), 4: _turn(4, "Melanie")}
    hits = [RecallHit(seq=3, score=3.0), RecallHit(seq=4, score=2.0), RecallHit(seq=1, score=1.8),
            RecallHit(seq=2, score=1.0, neighbour_of=3)]
    settings = RecallSettings(speaker_focus=2.0, focus_neighbours=True)
    focused = focus_on_speakers("What does Melanie like?", hits, turns, settings)
    assert [(h.seq, h.score) for h in focused] == [(4, 4.0), (3, 3.0), (1, 1.8), (2, 1.0)]
    # Both named, nobody named, or focus off: the order is unchanged.
    assert focus_on_speakers("Did Melanie and Caroline paint?", hits, turns, settings) == hits
    assert focus_on_speakers("What did we paint?", hits, turns, settings) == hits
    assert focus_on_speakers("What does Melanie like?", hits, turns, RecallSettings(speaker_focus=1.0)) == hits


def test_focus_lifts_a_neighbour_with_its_hit() -> None:
    turns = {1: _turn(1, "Caroline"), 2: _turn(2, "Melanie"), 5: _turn(5, "Caroline")}
    hits = [RecallHit(seq=5, score=3.0), RecallHit(seq=2, score=2.0), RecallHit(seq=1, score=1.0, neighbour_of=2)]
    settings = RecallSettings(speaker_focus=2.0, focus_neighbours=True)
    focused = focus_on_speakers("Where does Melanie live?", hits, turns, settings)
    assert [(h.seq, h.neighbour_of, h.score) for h in focused] == [(2, None, 4.0), (5, None, 3.0), (1, 2, 2.0)]


def test_focus_lifts_only_what_the_named_speaker_said() -> None:
    # By default a neighbour is lifted by who said it, not by its hit: the other speaker's turn
    # before Melanie's hit stays where it was, Melanie's turn before Caroline's hit rises.
    turns = {1: _turn(1, "Caroline"), 2: _turn(2, "Melanie"), 4: _turn(4, "Melanie"), 5: _turn(5, "Caroline")}
    hits = [RecallHit(seq=5, score=3.0), RecallHit(seq=2, score=2.0),
            RecallHit(seq=4, score=1.5, neighbour_of=5), RecallHit(seq=1, score=1.0, neighbour_of=2)]
    focused = focus_on_speakers("Where does Melanie live?", hits, turns, RecallSettings(speaker_focus=2.0))
    assert [(h.seq, h.neighbour_of, h.score) for h in focused] == [
        (2, None, 4.0), (5, None, 3.0), (4, 5, 3.0), (1, 2, 1.0)
    ]


def test_turns_without_speakers_are_left_alone() -> None:
    turns = {1: _turn(1, None), 2: _turn(2, None)}
    hits = [RecallHit(seq=1, score=2.0), RecallHit(seq=2, score=1.0)]
    assert focus_on_speakers("What does Melanie like?", hits, turns, RecallSettings()) == hits


def _dialogue() -> list[NewTurn]:
    # Caroline talks about painting more (and more often) than Melanie does, and to Melanie.
    lines = [("Caroline", "Melanie, I love painting, painting sunsets and painting flowers."),
             ("Melanie", "Nice. I went camping with the kids."),
             ("Caroline", "Oh Melanie, painting keeps me calm, I paint every day."),
             ("Melanie", "I started painting horses last week.")]
    lines += [("Caroline" if i % 2 else "Melanie", f"The weather was grey on day {i}.") for i in range(40)]
    return [NewTurn(role="user" if s == "Caroline" else "assistant", content=c, tokens=len(c),
                    created_at=T0 + timedelta(minutes=i), metadata={"speaker": s})
            for i, (s, c) in enumerate(lines)]


async def test_recall_puts_the_named_speakers_turn_first_in_both_index_paths(tmp_path: Path) -> None:
    question = "What does Melanie paint?"
    plain = MemoryStore()
    await plain.append(SessionKey("t", "s"), _dialogue())
    state = await plain.load(SessionKey("t", "s"), recent=6)
    unfocused = await Recaller(RecallSettings(speaker_focus=1.0)).recall(plain, state, question)
    assert unfocused[0].metadata["speaker"] == "Caroline"  # the lexical ranking alone
    recalled = await Recaller().recall(plain, state, question)
    order = [t.seq for t in recalled]
    assert recalled[0].metadata["speaker"] == "Melanie"
    assert order.index(4) < order.index(1) and order.index(4) < order.index(3)
    stored = open_store(f"sqlite:///{tmp_path}/focus.db")
    try:
        await stored.append(SessionKey("t", "s"), _dialogue())
        state = await stored.load(SessionKey("t", "s"), recent=6)
        from_store = await Recaller().recall(stored, state, question)
        assert [t.seq for t in from_store] == [t.seq for t in recalled]
    finally:
        await stored.close()


def test_optional_pins_come_first_only_within_their_share() -> None:
    weights = {"constraints": 0.05, "recent": 0.95}
    # All firm: a quarter of the budget, as before.
    assert allocate(1000, {"constraints": 800, "recent": 5000}, weights=weights) == {
        "constraints": 250, "recent": 750}
    # All optional (pinned facts): only their weighted share.
    assert allocate(1000, {"constraints": 800, "recent": 5000}, weights=weights, optional_pins=800) == {
        "constraints": 50, "recent": 950}
    # Firm ones first, then facts within what is left of the share.
    assert allocate(1000, {"constraints": 800, "recent": 5000}, weights=weights, optional_pins=770) == {
        "constraints": 50, "recent": 950}
    assert allocate(1000, {"constraints": 800, "recent": 5000}, weights=weights, optional_pins=700) == {
        "constraints": 100, "recent": 900}
    # Budget nobody else wants still flows to them.
    assert allocate(1000, {"constraints": 800, "recent": 100}, weights=weights, optional_pins=800) == {
        "constraints": 800, "recent": 100}


def test_pinned_facts_give_way_to_recalled_turns_but_preferences_stay() -> None:
    counter = CharTokenCounter()
    turns = tuple(
        Turn(seq=i, role="user" if i % 2 else "assistant", content=f"line {i} " + "word " * 20,
             tokens=counter.count(f"line {i} " + "word " * 20), created_at=T0 + timedelta(minutes=i))
        for i in range(1, 201)
    )
    facts = tuple(Constraint(key=f"fact:{i}", value=f"I did thing number {i} last week", kind="fact",
                             source_seq=i) for i in range(1, 61))
    preference = Constraint(key="spice", value="no spicy food", kind="preference", source_seq=1)
    state = SessionState(tenant="t", session_id="s", turns=turns[-10:], last_seq=200,
                         constraints=(preference, *facts), recalled=turns[:150])
    strategy = get_strategy("default")
    ctx = assemble(state, "what did I say?", counter=counter, budget=Budget(context_window=4000, reply_reserve=0),
                   strategy=strategy, now=T0 + timedelta(days=1))
    pins = ctx.layer("constraints")
    assert pins is not None and any("no spicy food" in item.text for item in pins.items)
    flexible = sum(ctx.accounts[n].used for n in ("constraints", "summary", "key_moments", "recall", "recent"))
    # The facts stay near the layer's 5 % share instead of the quarter they could take.
    assert ctx.accounts["constraints"].used <= 0.08 * flexible
    assert ctx.accounts["recall"].used > 0.5 * flexible
