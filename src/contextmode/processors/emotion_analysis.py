"""What the emotion scorer found in a text: its intensity and the words behind it.

Its own module so that `emotion` (the scorer) and `emotion_model` (the learned parts)
both read it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..text.lang import Language

__all__ = ["EmotionAnalysis", "EmotionHit", "emotion_level"]


@dataclass(frozen=True, kw_only=True)
class EmotionHit:
    """One emotion word found in a text."""

    word: str
    """The lexicon entry, as it appears in the text (or its English base form)."""
    weight: float
    """0–1 after modifiers and negation."""
    polarity: str
    """``+``, ``-`` or ``!`` (arousal), from the lexicon."""
    negated: bool = False


@dataclass(frozen=True, kw_only=True)
class EmotionAnalysis:
    """The intensity of a text and the words behind it."""

    intensity: float
    """0 (neutral) – 1 (overwhelming)."""
    hits: tuple[EmotionHit, ...] = ()
    language: Language = "en"
    model_probability: float | None = None
    """Chinese only: the text model's probability 0–1 that the text is emotional (step 4)."""
    logit: float | None = None
    """The logit behind ``intensity`` (after context, before calibration); ``None`` for the lexicon alone."""

    @property
    def level(self) -> int:
        """The 1–5 emotion level of the intensity (see `emotion_level`)."""
        return emotion_level(self.intensity)


def emotion_level(intensity: float) -> int:
    """Map a 0–1 intensity to the summaries' 1–5 scale (1 calm … 5 overwhelming)."""
    return max(1, min(5, 1 + int(intensity * 5)))
