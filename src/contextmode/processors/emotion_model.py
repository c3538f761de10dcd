"""The learned and calibrated parts of the emotion score (key moments).

Three pieces, all trained by ``scripts/train_emotion.py`` on dev data only and shipped
together as ``data/emotion_zh.json``; inference is pure Python.

1. **Chinese text model.** Most emotional lines in Chinese conversation carry no emotion
   word ("撞你个头", "好意思吗你"), so the lexicon alone scores them 0. A logistic
   regression over hashed features of the utterance (trained on CPED's
   neutral-vs-emotional labels) gives a logit ``z``. Features (binary presence, CRC-32
   hashed into ``buckets`` slots): character 1–2-grams with ``^``/``$`` marking the ends;
   the lexicon's verdict, binned (intensity tenths, any word, negated word, polarity);
   length in characters, binned.
2. **Dialogue context.** Feelings last beyond one line: a turn said in the middle of a
   quarrel is more likely emotional than the same words in small talk. A second, dense
   logistic regression reads the turn's own logit and those of the turns before it
   (`CONTEXT_FEATURES`: over the last `NEAR_WINDOW` the mean, the last one and the mean
   of the same speaker's, i.e. the speaker's baseline; over the last `CONTEXT_WINDOW`
   the mean, the conversation's mood). With no earlier turns it reads the turn alone.
3. **Calibration.** A turn above 0.7 is a key moment. The final intensity is
   ``logistic(scale · z + shift)`` per language (`calibrate`), chosen so that the share
   of dev turns above 0.7 equals the share labelled strongly emotional and, for Chinese,
   the share below 0.3 (`CALM_THRESHOLD`) the share labelled neutral: a monotone map, so
   the ranking is the model's own.

English has no turn-level labels in the dev data: its logit is that of the lexicon and
VADER score (see `emotion`), and only its calibration shift is fitted (on ESConv).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from ._hashed_model import feature_slots, logistic, pack_weights, unpack_weights
from .emotion_analysis import EmotionAnalysis

__all__ = [
    "CALM_THRESHOLD",
    "CONTEXT_FEATURES",
    "CONTEXT_WINDOW",
    "DEFAULT_MODEL_FILE",
    "KEY_MOMENT_THRESHOLD",
    "NEAR_WINDOW",
    "Calibration",
    "ContextModel",
    "EmotionModel",
    "PriorLogit",
    "calibrate",
    "calibrated",
    "context_features",
    "emotion_features",
    "feature_slots",
    "load_emotion_model",
    "logit",
    "with_lexicon_floor",
]

DEFAULT_MODEL_FILE = "emotion_zh.json"
_FORMAT = "contextmode-emotion/2"
KEY_MOMENT_THRESHOLD = 0.7
"""A turn above this intensity is "strongly emotional", a key moment."""
CALM_THRESHOLD = 0.3
"""Below this a turn is calm (level 1–2 of 5): where the dev share labelled neutral falls."""
CONTEXT_WINDOW = 20
"""Earlier turns of the conversation the context stage reads (the mood of the conversation)."""
NEAR_WINDOW = 5
"""Of those, the last few read on their own (the exchange just before)."""
CONTEXT_FEATURES = (
    "own", "prev_mean", "has_prev", "prev_last", "same_mean", "has_same", "mood", "log_turns",
)
"""Inputs of the context stage, in weight order (see `context_features`)."""


def logit(p: float) -> float:
    """Inverse of the logistic function, with ``p`` clamped to [0.001, 0.999]."""
    p = min(max(p, 0.001), 0.999)
    return math.log(p / (1.0 - p))


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """``intensity = logistic(scale · z + shift)``: a monotone map, the ranking is kept."""

    scale: float = 1.0
    shift: float = 0.0

    def __call__(self, z: float) -> float:
        return logistic(self.scale * z + self.shift)


def calibrated(z: float, calibration: Calibration) -> float:
    """Intensity 0–1 of a logit ``z``."""
    return calibration(z)


def with_lexicon_floor(lexical: float, intensity: float) -> float:
    """Chinese: strong emotion words are never pulled down by the model (the larger one)."""
    return max(lexical, intensity)


def _quantile_cut(ordered: Sequence[float], share_above: float) -> float:
    """A value with ``share_above`` of ``ordered`` above it (midway between neighbours)."""
    k = min(len(ordered) - 1, max(0, round(len(ordered) * (1.0 - share_above))))
    below = ordered[k - 1] if k > 0 else ordered[0] - 1.0
    return (below + ordered[k]) / 2.0


def calibrate(
    logits: Sequence[float], strong_share: float, neutral_share: float | None = None
) -> Calibration:
    """Calibration putting the top ``strong_share`` of ``logits`` above `KEY_MOMENT_THRESHOLD`.

    With ``neutral_share`` too, the bottom ``neutral_share`` also fall below
    `CALM_THRESHOLD` (two points fix scale and shift); without it only the shift moves.
    """
    if not logits:
        return Calibration()
    ordered = sorted(logits)
    strong_cut = _quantile_cut(ordered, min(max(strong_share, 0.0), 1.0))
    if neutral_share is not None and 0.0 < neutral_share < 1.0 - strong_share:
        calm_cut = _quantile_cut(ordered, 1.0 - neutral_share)
        if strong_cut - calm_cut > 1e-6:
            scale = (logit(KEY_MOMENT_THRESHOLD) - logit(CALM_THRESHOLD)) / (strong_cut - calm_cut)
            return Calibration(scale=scale, shift=logit(KEY_MOMENT_THRESHOLD) - scale * strong_cut)
    return Calibration(shift=logit(KEY_MOMENT_THRESHOLD) - strong_cut)


@dataclass(frozen=True, kw_only=True)
class PriorLogit:
    """An earlier turn of the conversation, as the context stage sees it."""

    logit: float
    """Its own text logit (stage 1)."""
    same_speaker: bool
    """Whether the same speaker said it."""


def context_features(own: float, prior: Sequence[PriorLogit]) -> list[float]:
    """Values of `CONTEXT_FEATURES` for a turn of logit ``own`` after ``prior`` (oldest first).

    ``prev_mean``/``prev_last``/``same_mean`` read the last `NEAR_WINDOW` turns (the
    speaker's own ones are their baseline), ``mood`` the mean of the last
    `CONTEXT_WINDOW`, ``log_turns`` how many there were.
    """
    far = [p.logit for p in list(prior)[-CONTEXT_WINDOW:]]
    near = list(prior)[-NEAR_WINDOW:]
    same = [p.logit for p in near if p.same_speaker]
    values = [p.logit for p in near]
    return [
        own,
        sum(values) / len(values) if values else 0.0,
        1.0 if values else 0.0,
        values[-1] if values else 0.0,
        sum(same) / len(same) if same else 0.0,
        1.0 if same else 0.0,
        sum(far) / len(far) if far else 0.0,
        math.log1p(len(far)),
    ]


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


@dataclass(frozen=True, kw_only=True)
class ContextModel:
    """Dense logistic regression over `CONTEXT_FEATURES`."""

    weights: tuple[float, ...]
    intercept: float

    def logit(self, own: float, prior: Sequence[PriorLogit]) -> float:
        """Logit of a turn of text logit ``own`` after ``prior`` (oldest first)."""
        values = context_features(own, prior)
        return self.intercept + sum(w * v for w, v in zip(self.weights, values, strict=True))


_IDENTITY_CALIBRATION = Calibration()
_IDENTITY_CONTEXT = ContextModel(
    weights=(1.0,) + (0.0,) * (len(CONTEXT_FEATURES) - 1), intercept=0.0
)


@dataclass(frozen=True, kw_only=True)
class EmotionModel:
    """The shipped Chinese text model, context stage and per-language calibration."""

    buckets: int
    """Number of hash slots."""
    weights: dict[int, float]
    """Non-zero weight per slot."""
    intercept: float
    """Bias term of the text model."""
    context: ContextModel = _IDENTITY_CONTEXT
    """Stage 2 (identity: the turn's own logit)."""
    calibration: dict[str, Calibration] = field(default_factory=dict)
    """Per language (``zh``, ``en``); the identity when missing."""

    def calibration_for(self, language: str) -> Calibration:
        """The calibration of ``language`` (identity when not fitted)."""
        return self.calibration.get(language, _IDENTITY_CALIBRATION)
    info: dict[str, Any] | None = None
    """Training provenance (data, content hashes, cross-validated figures)."""

    def text_logit(self, text: str, analysis: EmotionAnalysis) -> float:
        """Stage 1: logit that ``text`` is emotional rather than neutral."""
        slots = feature_slots(emotion_features(text, analysis), self.buckets)
        return self.intercept + sum(self.weights.get(s, 0.0) for s in slots)

    def probability(self, text: str, analysis: EmotionAnalysis) -> float:
        """Stage 1 as a probability 0–1 (no context, no calibration)."""
        return logistic(self.text_logit(text, analysis))

    def to_json(self) -> dict[str, Any]:
        """Compact JSON form: sorted slots and weights quantised to int16, zlib + base64."""
        return {
            "format": _FORMAT,
            "buckets": self.buckets,
            "intercept": self.intercept,
            **pack_weights(self.weights),
            "context": {"features": list(CONTEXT_FEATURES), "weights": list(self.context.weights),
                        "intercept": self.context.intercept},
            "calibration": {lang: {"scale": c.scale, "shift": c.shift}
                            for lang, c in self.calibration.items()},
            "info": self.info or {},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EmotionModel:
        """Inverse of `to_json`."""
        if data.get("format") != _FORMAT:
            raise ValueError(f"not an emotion model: format {data.get('format')!r}")
        ctx = data.get("context") or {}
        context = _IDENTITY_CONTEXT
        if ctx:
            if list(ctx.get("features", [])) != list(CONTEXT_FEATURES):
                raise ValueError("emotion model: unknown context features")
            context = ContextModel(weights=tuple(float(w) for w in ctx["weights"]),
                                   intercept=float(ctx["intercept"]))
        return cls(
            buckets=int(data["buckets"]),
            weights=unpack_weights(data),
            intercept=float(data["intercept"]),
            context=context,
            calibration={
                str(lang): Calibration(scale=float(c["scale"]), shift=float(c["shift"]))
                for lang, c in (data.get("calibration") or {}).items()
            },
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
