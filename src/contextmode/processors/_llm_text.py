"""Reading plain-text model answers: labels, quotes, yes/no verdicts, intensities; formatting turns.

Shared by the LLM-backed processors (`contextmode.processors.llm`); every
function is total: odd input gives ``None`` or an empty string, never an error.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..jsonparse import extract_json, validate_as
from ..types import Turn

__all__ = ["clean_model_text", "format_turns", "parse_intensity", "parse_yes_no"]

_FENCE = re.compile(r"^```[a-zA-Z]*\s*\n?|\n?```\s*$")
_LABEL = re.compile(
    r"^(?:改写后的?(?:独立)?问题|改写结果|改写后|独立问题|新的摘要|摘要|"
    r"standalone question|rewritten question|rewrite|new summary|summary|question|answer)"
    r"\s*[:：]\s*",
    re.I,
)
_QUOTE_PAIRS = {'"': '"', "'": "'", "“": "”", "‘": "’", "「": "」", "『": "』", "`": "`", "《": "》"}


def format_turns(turns: Sequence[Turn], *, chinese: bool, turn_chars: int = 600, times: bool = False) -> str:
    """Turns as ``用户: …`` / ``User: …`` lines, each cut to ``turn_chars`` characters."""
    labels = {"user": "用户", "assistant": "助手", "system": "系统"} if chinese else {
        "user": "User", "assistant": "Assistant", "system": "System"}
    lines = []
    for turn in turns:
        text = " ".join(turn.content.split())
        if len(text) > turn_chars:
            text = text[:turn_chars] + "…"
        stamp = f"[{turn.created_at:%m-%d %H:%M}] " if times else ""
        lines.append(f"{stamp}{labels[turn.role]}: {text}")
    return "\n".join(lines) or ("（无）" if chinese else "(none)")


def clean_model_text(text: str) -> str:
    """Strip code fences, a leading label (``改写后的问题：``, ``Summary:``), markdown bold and
    surrounding quotes from a plain-text model answer."""
    text = _FENCE.sub("", text.strip()).strip()
    text = text.replace("**", "").strip()
    text = _LABEL.sub("", text).strip()
    while len(text) >= 2 and _QUOTE_PAIRS.get(text[0]) == text[-1]:
        text = text[1:-1].strip()
    return text


def parse_yes_no(text: str) -> bool | None:
    """``yes``/``no`` (or 是/需要/不需要/否, true/false, a JSON verdict) → bool; ``None`` if unclear."""
    head = clean_model_text(text).lower().lstrip("([{\"' ")
    for prefix, verdict in (("不需要", False), ("不", False), ("否", False), ("no", False),
                            ("false", False), ("需要", True), ("是", True), ("yes", True),
                            ("true", True)):
        if head.startswith(prefix) and not (prefix == "no" and head[2:3].isalpha()):
            return verdict
    data = extract_json(text) if "{" in text else None
    if isinstance(data, dict):
        for key in ("needs_context", "answer", "verdict", "result"):
            if key in data:
                try:
                    return bool(validate_as(data[key], bool))
                except ValueError:
                    return None
    match = re.search(r"\b(yes|no)\b|不需要|需要", head)
    if match:
        return match.group(0) in ("yes", "需要")
    return None


_NUMBER = re.compile(r"(-?\d+(?:\.\d+)?)\s*(%|/\s*(?:5|10|100)\b)?")


def parse_intensity(text: str) -> float | None:
    """An emotion intensity in 0–1 from ``{"intensity": 0.7}``, a bare ``0.7``, ``70%`` or ``4/5``.

    Out-of-range values are clamped; ``None`` when no number is found.
    """
    raw: Any = None
    data = extract_json(text) if ("{" in text or "[" in text) else None
    if isinstance(data, dict):
        for key in ("intensity", "emotion_intensity", "score", "value", "强度", "情绪强度"):
            if key in data:
                raw = data[key]
                break
    if raw is None:
        raw = clean_model_text(text)
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int | float):
        return min(1.0, max(0.0, float(raw)))
    match = _NUMBER.search(str(raw))
    if not match:
        return None
    value, scale = float(match.group(1)), (match.group(2) or "").replace(" ", "")
    if scale == "%":
        value /= 100
    elif scale.startswith("/"):
        value /= float(scale[1:])
    return min(1.0, max(0.0, value))
