"""Which language a text is in: Chinese or English (the two the processors know)."""

from __future__ import annotations

import re
from typing import Literal

__all__ = ["Language", "cjk_ratio", "detect_language", "is_chinese"]

Language = Literal["zh", "en"]

_ANY_CJK = re.compile(r"[\u3400-\u9fff]")
_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
_LATIN = re.compile(r"[A-Za-z]")


def is_chinese(text: str) -> bool:
    """True when ``text`` has at least one CJK character (then Chinese wording is used)."""
    return bool(_ANY_CJK.search(text))


def cjk_ratio(text: str) -> float:
    """Share of CJK characters among the CJK and Latin letters of ``text`` (0 when it has none)."""
    cjk = len(_CJK.findall(text))
    latin = len(_LATIN.findall(text))
    return cjk / (cjk + latin) if cjk + latin else 0.0


def detect_language(text: str) -> Language:
    """``zh`` when CJK characters make at least a fifth of the letters, else ``en``.

    A fifth, not a half: Chinese messages often carry English names and code, and one
    CJK character carries about as much as a whole English word.
    """
    return "zh" if cjk_ratio(text) >= 0.2 else "en"
