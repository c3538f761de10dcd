"""Each answer follows the message it answers, even in sessions stored interleaved."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from contextmode.assembly import AssemblyConfig, assemble, to_messages
from contextmode.assembly.assemble import paired_turns
from contextmode.memory import Budget
from contextmode.types import Turn
from tests.assembly.test_assembly import COUNTER, NOW, make_state, make_turn


def _interleaved(n: int) -> tuple[Turn, ...]:
    """What concurrent turns stored before serialisation: n questions, then their n answers."""
    questions = [make_turn(i, f"question {i}", role="user") for i in range(1, n + 1)]
    answers = [
        dataclasses.replace(make_turn(n + i, f"answer {i}", role="assistant"), metadata={"reply_to": i})
        for i in range(1, n + 1)
    ]
    return (*questions, *answers)


def test_interleaved_history_reaches_the_model_as_pairs() -> None:
    state = make_state(_interleaved(4))
    ctx = assemble(state, "next", counter=COUNTER, strategy="window", budget=Budget(context_window=8000),
                   config=AssemblyConfig(format="messages"), now=NOW)
    history = [(m.role, m.content) for m in to_messages(ctx)][1:-1]  # system first, the new message last
    assert history == [
        pair for i in range(1, 5) for pair in (("user", f"question {i}"), ("assistant", f"answer {i}"))
    ]


def test_answers_without_their_question_keep_their_place() -> None:
    # The window starts after question 1: its answer has no question to follow.
    kept = paired_turns(_interleaved(3)[1:])
    assert [t.content for t in kept] == ["question 2", "answer 2", "question 3", "answer 3", "answer 1"]


def test_pairing_changes_nothing_in_a_serialised_session() -> None:
    turns = tuple(
        dataclasses.replace(t, metadata={"reply_to": t.seq - 1}) if t.role == "assistant" else t
        for t in (make_turn(s, f"t{s}") for s in range(1, 9))
    )
    assert paired_turns(turns) == list(turns)


@given(st.lists(st.integers(min_value=0, max_value=5), min_size=1, max_size=12))
def test_pairing_keeps_every_turn_and_puts_answers_after_their_question(delays: list[int]) -> None:
    # Question i is answered ``delays[i]`` turns later (answers stored in any order after it).
    events: list[tuple[str, int]] = []
    pending: list[tuple[int, int]] = []
    for i, delay in enumerate(delays):
        events.append(("q", i))
        pending.append((i, delay))
        events.extend(("a", q) for q, d in pending if d == 0)
        pending = [(q, d - 1) for q, d in pending if d > 0]
    events.extend(("a", q) for q, _ in pending)
    seq_of: dict[int, int] = {}
    turns: list[Turn] = []
    for seq, (kind, q) in enumerate(events, start=1):
        if kind == "q":
            seq_of[q] = seq
            turns.append(make_turn(seq, f"q{q}", role="user"))
        else:
            turns.append(dataclasses.replace(make_turn(seq, f"a{q}", role="assistant"), metadata={"reply_to": seq_of[q]}))
    out = paired_turns(turns)
    assert sorted(t.seq for t in out) == [t.seq for t in turns]
    contents = [t.content for t in out]
    for q in range(len(delays)):
        assert contents[contents.index(f"q{q}") + 1] == f"a{q}"
