"""Learned Chinese emotion signal beside the lexicon (seed 001's key moments).

Most emotional lines in Chinese conversation carry no emotion word ("撞你个头",
"好意思吗你"), so the lexicon alone scores them 0. A logistic regression over hashed
features of the utterance, trained on CPED's neutral-vs-emotional labels by
``scripts/train_emotion.py`` and shipped as ``data/emotion_zh.json``, adds a second
signal. Inference is pure Python (one dictionary lookup per feature).

Features (binary presence, CRC-32 hashed into ``buckets`` slots):

* character 1–2-grams of the utterance, with ``^``/``$`` marking its ends (so "吗你$"
  and "^你" count apart from the same characters mid-sentence);
* the lexicon's verdict, binned: its intensity (tenths), whether it found any word,
  a negated word, a positive or a negative word;
* length in characters, binned.

The model's probability ``p`` (trained with balanced classes, so 0.5 is the decision
boundary) becomes an intensity ``p²`` (`model_intensity`: 0.25 at the boundary, 0.7 at
``p ≈ 0.84``), and the turn's intensity is the larger of that and the lexicon's
(`combine`): strong words alone, or a model at least 84 % sure, make a key moment
(> 0.7). The square keeps the model's ranking intact (no flat region), unlike a cut.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._hashed_model import feature_slots, logistic, pack_weights, unpack_weights

if TYPE_CHECKING:
    from .emotion import EmotionAnalysis

__all__ = [
    "DEFAULT_MODEL_FILE",
    "EmotionModel",
    "combine",
    "emotion_features",
    "feature_slots",
    "load_emotion_model",
    "model_intensity",
]

DEFAULT_MODEL_FILE = "emotion_zh.json"
_FORMAT = "contextmode-emotion/1"


def emotion_features(text: str, analysis: EmotionAnalysis) -> list[str]:
    """Feature names of ``text`` given the lexicon's ``analysis`` of it (see module doc)."""
    squeezed = "".join(text.split(" ")).strip()
    padded = f"^{squeezed}$"
    features = [f"c1:{ch}" for ch in squeezed]
    features.extend(f"c2:{padded[i : i + 2]}" for i in range(len(padded) - 1))
    features.append(f"lex:{min(int(analysis.intensity * 10), 9)}")
    if analysis.hits:
        features.append("lex:hit")
        features.extend(f"lex:pol{hit.polarity}" for hit in analysis.hits)
        if any(hit.negated for hit in analysis.hits):
            features.append("lex:neg")
    length = len(squeezed)
    features.append(f"len:{min(length, 8) if length <= 8 else 8 + min(length // 8, 6)}")
    return features


def model_intensity(probability: float) -> float:
    """Map the model's probability 0–1 of "emotional" to a 0–1 intensity (its square)."""
    return min(max(probability, 0.0), 1.0) ** 2


def combine(lexical: float, probability: float) -> float:
    """Intensity 0–1 of a turn from the lexicon's intensity and the model's probability."""
    return max(lexical, model_intensity(probability))


@dataclass(frozen=True, kw_only=True)
class EmotionModel:
    """Logistic-regression weights over hashed feature slots."""

    buckets: int
    """Number of hash slots."""
    weights: dict[int, float]
    """Non-zero weight per slot."""
    intercept: float
    """Bias term of the logistic regression."""
    info: dict[str, Any] | None = None
    """Training provenance (data, cross-validated figures), for humans."""

    def probability(self, text: str, analysis: EmotionAnalysis) -> float:
        """Probability 0–1 that ``text`` is emotional rather than neutral."""
        slots = feature_slots(emotion_features(text, analysis), self.buckets)
        return logistic(self.intercept + sum(self.weights.get(s, 0.0) for s in slots))

    def to_json(self) -> dict[str, Any]:
        """Compact JSON form: sorted slots and weights quantised to int16, zlib + base64."""
        return {
            "format": _FORMAT,
            "buckets": self.buckets,
            "intercept": self.intercept,
            **pack_weights(self.weights),
            "info": self.info or {},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EmotionModel:
        """Inverse of `to_json`."""
        if data.get("format") != _FORMAT:
            raise ValueError(f"not an emotion model: format {data.get('format')!r}")
        return cls(
            buckets=int(data["buckets"]),
            weights=unpack_weights(data),
            intercept=float(data["intercept"]),
            info=data.get("info") or {},
        )


@lru_cache(maxsize=4)
def load_emotion_model(path: str | None = None) -> EmotionModel | None:
    """The model at ``path``, or the shipped one when ``None`` (``None`` if not shipped)."""
    if path is not None:
        return EmotionModel.from_json(json.loads(Path(path).read_text(encoding="utf-8")))
    resource = resources.files("contextmode.processors").joinpath("data", DEFAULT_MODEL_FILE)
    if not resource.is_file():
        return None
    return EmotionModel.from_json(json.loads(resource.read_text(encoding="utf-8")))
