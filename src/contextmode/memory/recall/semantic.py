"""Semantic query expansion: a question's words also ask for their nearest words by meaning.

BM25 finds a turn only through a word it shares with the question; "What martial arts
has John done?" never meets "I'm off to do some taekwondo!". `Thesaurus` holds, for each
of ~15,000 English index terms (the whole words of the model's vocabulary), its nearest other terms by meaning with their
cosine similarity, distilled once offline from all-MiniLM-L6-v2
(``scripts/distill_thesaurus.py``: each word embedded alone, the model2vec way; the file is
``data/thesaurus_en.npz``, 0.4 MB). At query time it is a dictionary look-up, numpy
only, no model: `expand` adds each English content term's neighbours above a similarity
floor as further query terms, weighted ``weight × similarity`` (below the message's own
terms, like pseudo-relevance feedback; `Recaller` leaves out neighbours found in many of
the session's turns and keeps at most a dozen, see ``RecallSettings.semantic_*``). Because
expansion only adds query terms, the
postings a store keeps answer it as they answer any query, so a cold worker still reads
no turn to rank (`stored`).

Not expanded: Chinese (the model is English), numbers, and capitalised words of the
message (names: "Caroline" would ask for every other first name).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from io import BytesIO
from pathlib import Path

import numpy as np

from ...text.index_terms import analyze

__all__ = ["SCALE", "THESAURUS_FILE", "Thesaurus", "default_thesaurus", "expand", "proper_terms"]

THESAURUS_FILE = "thesaurus_en.npz"
SCALE = 250.0
"""Similarities are kept as ``round(cosine × SCALE)`` in one byte."""

_CAPITALISED = re.compile(r"\b[A-Z][a-zA-Z']*")


@dataclass(frozen=True)
class Thesaurus:
    """Each term's nearest terms by meaning (best first) and their cosine similarity."""

    terms: tuple[str, ...]
    ids: dict[str, int]
    neighbour_ids: np.ndarray
    """``(terms, k)`` integer matrix of term ids."""
    similarity: np.ndarray
    """``(terms, k)`` cosines × `SCALE`, one byte each."""

    @staticmethod
    def load(source: Path | bytes) -> Thesaurus:
        """From the ``.npz`` file ``scripts/distill_thesaurus.py`` writes (a path or its bytes)."""
        with np.load(source if isinstance(source, Path) else BytesIO(source)) as data:
            terms = tuple(bytes(data["terms"]).decode().split("\n"))
            ids = np.asarray(data["neighbours"])
            sims = np.asarray(data["similarity"])
        return Thesaurus(terms, {t: i for i, t in enumerate(terms)}, ids, sims)

    def neighbours(self, term: str, *, k: int | None = None, floor: float = 0.0) -> list[tuple[str, float]]:
        """Up to ``k`` nearest terms of ``term`` with a similarity of at least ``floor``."""
        row = self.ids.get(term)
        if row is None:
            return []
        out = []
        for nid, sim in zip(self.neighbour_ids[row][:k], self.similarity[row][:k], strict=True):
            value = float(sim) / SCALE
            if value < floor:
                break
            out.append((self.terms[int(nid)], round(value, 3)))
        return out


@cache
def default_thesaurus() -> Thesaurus:
    """The shipped thesaurus (read once per process, ~20 ms)."""
    raw = resources.files("contextmode.memory.recall").joinpath("data", THESAURUS_FILE).read_bytes()
    return Thesaurus.load(raw)


def proper_terms(message: str) -> set[str]:
    """Index terms of the message's capitalised words (names, mostly): not expanded."""
    return {t for m in _CAPITALISED.finditer(message) for t in analyze(m.group())}


def expand(
    message: str, weights: Mapping[str, float], thesaurus: Thesaurus, *,
    neighbours: int, floor: float, weight: float, keep: Callable[[str], bool] | None = None,
    most: int | None = None,
) -> dict[str, float]:
    """``weights`` plus, for each expandable term of ``weights`` (English letters, not a
    capitalised word of ``message``), its ``neighbours`` nearest terms with a similarity
    of at least ``floor`` (and, given ``keep``, for which it says yes), each weighted
    ``weight × similarity`` (the highest when several terms propose it); terms already in
    ``weights`` keep their weight. ``most``: at most this many neighbours, the heaviest."""
    out = dict(weights)
    if neighbours <= 0:
        return out
    skip = proper_terms(message)
    for term in weights:
        if term in skip or not term.isascii() or not term.isalpha():
            continue
        for near, sim in thesaurus.neighbours(term, k=neighbours, floor=floor):
            if near not in weights and (keep is None or keep(near)):
                out[near] = max(out.get(near, 0.0), weight * sim)
    if most is not None and len(out) - len(weights) > most:
        added = sorted((t for t in out if t not in weights), key=lambda t: (-out[t], t))
        for term in added[most:]:
            del out[term]
    return out
