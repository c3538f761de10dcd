"""Word lists of the offline language processors, kept as data files beside this module.

Each ``*.tsv`` file has one entry a line, tab-separated, ``#`` starting a comment.
The lists are hand-written for context-mode (no third-party lexicon is bundled).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Literal

from ...text.lang import Language

__all__ = [
    "EmotionWord",
    "Modifier",
    "emotion_words",
    "modifiers",
]



@dataclass(frozen=True, kw_only=True)
class EmotionWord:
    """One lexicon entry: how strongly a word carries a feeling."""

    word: str
    intensity: float
    """0–1: how strong the feeling is, whatever its sign."""
    polarity: str
    """``+`` positive, ``-`` negative, ``!`` arousal or surprise."""


@dataclass(frozen=True, kw_only=True)
class Modifier:
    """A word that changes the strength of the next emotion word."""

    word: str
    kind: Literal["intensifier", "diminisher", "negation"]
    weight: float
    """Multiplier applied to the emotion word (0 for negations, handled apart)."""


def _rows(name: str) -> list[list[str]]:
    text = resources.files(__package__).joinpath(name).read_text(encoding="utf-8")
    rows = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        rows.append(line.split("\t"))
    return rows


@cache
def emotion_words(language: Language) -> dict[str, EmotionWord]:
    """The emotion lexicon of ``language``, keyed by word."""
    return {
        row[0]: EmotionWord(word=row[0], intensity=float(row[1]), polarity=row[2])
        for row in _rows(f"{language}_emotion.tsv")
    }


@cache
def modifiers(language: Language) -> dict[str, Modifier]:
    """Intensifiers, diminishers and negations of ``language``, keyed by word."""
    out: dict[str, Modifier] = {}
    for row in _rows(f"{language}_modifiers.tsv"):
        kind = row[1]
        if kind not in ("intensifier", "diminisher", "negation"):
            raise ValueError(f"unknown modifier kind {kind!r} in {language}_modifiers.tsv")
        out[row[0]] = Modifier(word=row[0], kind=kind, weight=float(row[2]))  # type: ignore[arg-type]
    return out
