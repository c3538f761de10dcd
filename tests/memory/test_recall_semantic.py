"""Semantic query expansion: the shipped thesaurus (distilled from MiniLM) lets a question
find a turn that shares no word with it."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from contextmode.memory.recall import Recaller, RecallSettings, recall_query
from contextmode.memory.recall.semantic import SCALE, Thesaurus, default_thesaurus, expand
from contextmode.store.memory import MemoryStore
from contextmode.text.index_terms import analyze
from contextmode.types import NewTurn, SessionKey

T0 = datetime(2024, 3, 1, 9, 0, tzinfo=UTC)

_FILLER = [
    "The weather was lovely this weekend, we sat in the garden.",
    "Work has been busy, the project deadline is next week.",
    "I finished that novel you lent me, great ending.",
    "We went to the beach and built a sandcastle with the kids.",
    "My phone battery dies so fast these days.",
    "Dinner was pasta with a tomato sauce, nothing fancy.",
    "The train was late again this morning.",
    "I repainted the fence, it looks brand new.",
]


async def _session(needle: str) -> MemoryStore:
    """A conversation of 40 filler turns with ``needle`` said once, early on."""
    store = MemoryStore()
    turns = [NewTurn(role="user" if i % 2 == 0 else "assistant", tokens=10,
                     content=_FILLER[i % len(_FILLER)], created_at=T0 + timedelta(minutes=i),
                     metadata={"speaker": "John" if i % 2 == 0 else "Tim"})
             for i in range(40)]
    turns[6] = replace(turns[6], content=needle)
    await store.append(SessionKey("t", "s"), turns)
    return store


async def _recalled(store: MemoryStore, message: str, settings: RecallSettings) -> list[str]:
    state = await store.load(SessionKey("t", "s"))
    turns = await Recaller(settings).recall(store, state, message, limit=6)
    return [t.content for t in turns]


@pytest.mark.parametrize("needle", ["I'm off to my karate class tonight!", "Judo practice wiped me out."])
async def test_a_question_finds_a_turn_by_meaning(needle: str) -> None:
    store = await _session(needle)
    question = "Has anyone here done martial arts?"
    assert needle in await _recalled(store, question, RecallSettings())
    # BM25 alone has no word to go on.
    assert needle not in await _recalled(store, question, RecallSettings(semantic_neighbours=0))


def test_neighbours_join_the_query_below_the_message_terms() -> None:
    settings = RecallSettings()
    weights = recall_query("What did John paint last summer?", [], settings)
    thesaurus = default_thesaurus()
    added = {t: w for t, w in weights.items() if t not in analyze("What did John paint last summer?")}
    expected = thesaurus.neighbours("paint", k=settings.semantic_neighbours, floor=settings.semantic_floor)
    assert expected and all(added[t] == pytest.approx(settings.semantic_weight * sim) for t, sim in expected)
    assert all(0 < w < 1 for w in added.values())
    # A capitalised word is a name: "John" asks for no other first names.
    assert not set(t for t, _ in thesaurus.neighbours("john", k=8)) & set(added)
    assert thesaurus.neighbours("john", k=8)  # (it has some)


def test_chinese_and_numbers_are_not_expanded() -> None:
    settings = RecallSettings()
    for message in ("我妹妹下个月结婚", "2022, 8 and 15"):
        assert recall_query(message, [], settings) == {t: float(n) for t, n in
                                                       _counts(analyze(message)).items()}


def _counts(terms: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for term in terms:
        out[term] = out.get(term, 0) + 1
    return out


def test_the_shipped_thesaurus_speaks_the_index_terms() -> None:
    thesaurus = default_thesaurus()
    assert len(thesaurus.terms) > 10_000
    for word in ("karate", "taekwondo", "painting", "church", "religion", "hiking"):
        (term,) = analyze(word)
        assert term in thesaurus.ids, word
    near = dict(thesaurus.neighbours(analyze("martial")[0]))
    assert {"karat", "judo"} <= set(near)


def test_neighbours_respect_count_and_floor() -> None:
    thesaurus = Thesaurus(
        terms=("cat", "kitten", "dog", "car"),
        ids={"cat": 0, "kitten": 1, "dog": 2, "car": 3},
        neighbour_ids=np.array([[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 2, 1]]),
        similarity=np.rint(np.array([[0.9, 0.7, 0.3]] * 4) * SCALE).astype(np.uint8),
    )
    assert thesaurus.neighbours("cat") == [("kitten", 0.9), ("dog", 0.7), ("car", 0.3)]
    assert thesaurus.neighbours("cat", k=1) == [("kitten", 0.9)]
    assert thesaurus.neighbours("cat", floor=0.5) == [("kitten", 0.9), ("dog", 0.7)]
    assert thesaurus.neighbours("unknown") == []
    weights = expand("a cat and a dog", {"cat": 1.0, "dog": 1.0}, thesaurus, neighbours=2, floor=0.5, weight=0.5)
    # "dog" keeps its own weight; "kitten" comes once, at the best proposal.
    assert weights == {"cat": 1.0, "dog": 1.0, "kitten": pytest.approx(0.45)}
    assert expand("a cat", {"cat": 1.0}, thesaurus, neighbours=0, floor=0.5, weight=0.5) == {"cat": 1.0}
    # At most ``most`` neighbours, the heaviest.
    both = expand("car", {"car": 1.0}, thesaurus, neighbours=3, floor=0.5, weight=0.5)
    assert both == {"car": 1.0, "cat": pytest.approx(0.45), "dog": pytest.approx(0.35)}
    assert expand("car", {"car": 1.0}, thesaurus, neighbours=3, floor=0.5, weight=0.5, most=1) == {
        "car": 1.0, "cat": pytest.approx(0.45)}


class _Counts:
    def __init__(self, docs: int, df: dict[str, int]) -> None:
        self.docs = docs
        self._df = df

    def df(self, term: str) -> int:
        return self._df.get(term, 0)


def test_a_neighbour_in_many_turns_is_not_added() -> None:
    settings = RecallSettings()
    near = [t for t, _ in default_thesaurus().neighbours(
        "martial", k=settings.semantic_neighbours, floor=settings.semantic_floor)]
    common, rare = near[0], near[1]
    counts = _Counts(docs=1000, df={common: 51, rare: 50, "martial": 900})
    weights = recall_query("martial", [], settings, counts=counts)
    # Over 5 % of the turns: worth little (idf) and costly to score; the message's own term stays.
    assert common not in weights and rare in weights and weights["martial"] == 1.0
    assert common in recall_query("martial", [], settings)
    # In a long session the number of turns is bounded too (what a cold worker reads).
    big = _Counts(docs=100_000, df={common: 1001, rare: 1000})
    weights = recall_query("martial", [], settings, counts=big)
    assert common not in weights and rare in weights
