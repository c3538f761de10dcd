"""`postings.KeptHeads`: what the next append of a session needs, kept by the last one."""

from __future__ import annotations

from contextmode.store.postings import KeptHeads
from contextmode.types import NewTurn


def _turns(*texts: str) -> list[NewTurn]:
    return [NewTurn(role="user", content=text, tokens=1) for text in texts]


def test_a_kept_head_names_the_last_turn_and_is_taken_once() -> None:
    heads = KeptHeads()
    heads.keep(("t", "s"), 4, _turns("one", "two"), indexed=True, digest="d")
    head = heads.take(("t", "s"))
    assert head is not None
    assert (head.last, head.indexed_seq, head.digest, head.writes_index) == (6, 6, "d", True)
    assert head.previous is not None and (head.previous.seq, head.previous.content) == (6, "two")
    assert [t.seq for t in head.numbered(_turns("a", "b"))] == [7, 8]
    assert heads.take(("t", "s")) is None  # taken: the next append reads unless this one keeps


def test_an_unindexed_append_leaves_a_head_that_writes_no_index() -> None:
    heads = KeptHeads()
    heads.keep(("t", "s"), 10, _turns("x"), indexed=False)
    head = heads.take(("t", "s"))
    assert head is not None and head.indexed_seq is None and not head.writes_index


def test_long_turns_stale_entries_and_the_oldest_sessions_are_not_kept() -> None:
    heads = KeptHeads(sessions=2, chars=10)
    heads.keep(("t", "long"), 0, _turns("x" * 11), indexed=True)
    heads.keep(("t", "json"), 0, _turns("short"), indexed=True, size=11)  # its stored form is long
    assert ("t", "long") not in heads and ("t", "json") not in heads
    for sid in ("a", "b", "c"):
        heads.keep(("t", sid), 0, _turns(sid), indexed=True)
    assert ("t", "a") not in heads and ("t", "b") in heads and ("t", "c") in heads
    heads.forget(("t", "b"))
    assert ("t", "b") not in heads
    expired = KeptHeads(seconds=-1.0)
    expired.keep(("t", "s"), 0, _turns("x"), indexed=True)
    assert expired.take(("t", "s")) is None
