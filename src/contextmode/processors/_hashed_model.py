"""What the small shipped models share: hashed feature slots, the logistic function,
and the compact JSON form of their weights (int16-quantised, zlib, base64)."""

from __future__ import annotations

import base64
import math
import zlib
from array import array
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["feature_slots", "hash_feature", "logistic", "pack_weights", "unpack_weights"]


def hash_feature(name: str, buckets: int) -> int:
    """Slot of feature ``name`` among ``buckets`` (CRC-32 of its UTF-8 bytes)."""
    return zlib.crc32(name.encode("utf-8")) % buckets


def feature_slots(features: Iterable[str], buckets: int) -> list[int]:
    """Distinct slots of ``features``, sorted (binary presence, as in training)."""
    return sorted({hash_feature(f, buckets) for f in features})


def logistic(z: float) -> float:
    """1 / (1 + e^-z), clamped so extreme scores cannot overflow."""
    return 1.0 / (1.0 + math.exp(-max(-30.0, min(30.0, z))))


def pack_weights(weights: Mapping[int, float]) -> dict[str, Any]:
    """``{"scale", "slots", "weights"}``: sorted slots and weights quantised to int16."""
    slots = sorted(weights)
    top = max((abs(weights[s]) for s in slots), default=1.0) or 1.0
    scale = top / 32767
    quantised = array("h", (round(weights[s] / scale) for s in slots))
    return {
        "scale": scale,
        "slots": base64.b64encode(zlib.compress(array("I", slots).tobytes(), 9)).decode(),
        "weights": base64.b64encode(zlib.compress(quantised.tobytes(), 9)).decode(),
    }


def unpack_weights(data: Mapping[str, Any]) -> dict[int, float]:
    """Inverse of `pack_weights` (reads ``scale``, ``slots`` and ``weights`` of ``data``)."""
    slots = array("I")
    slots.frombytes(zlib.decompress(base64.b64decode(data["slots"])))
    quantised = array("h")
    quantised.frombytes(zlib.decompress(base64.b64decode(data["weights"])))
    scale = float(data["scale"])
    return {s: q * scale for s, q in zip(slots, quantised, strict=True)}
