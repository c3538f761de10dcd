"""Reading the emotion dev sets (CPED, ESConv) and recognising them by content hash.

The shipped emotion model records which dialogues it was fitted on as short content
hashes (`dialogue_hash`), so `contextmode eval emotion` can say ``in_sample: true`` for a
file that is (part of) its training data, whatever the file is called.
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "STRONG_LABELS",
    "STRONG_LEVEL",
    "Conversation",
    "Utterance",
    "cped_dialogue_hashes",
    "detect_format",
    "dialogue_hash",
    "file_sha256",
    "read_cped",
    "read_esconv",
    "utterance_dialogues",
]

STRONG_LABELS = frozenset(
    {"anger", "sadness", "fear", "disgust", "depress", "astonished", "happy", "grateful"}
)
"""CPED labels counted as strongly emotional: the named basic emotions, not the milder
``worried``/``relaxed`` nor the catch-all ``positive-other``/``negative-other``."""
STRONG_LEVEL = 5.0
"""ESConv: a seeker reporting intensity 5 of 5 is strongly emotional."""


@dataclass(frozen=True, kw_only=True)
class Utterance:
    """One CPED utterance."""

    text: str
    label: str
    dialogue: str
    speaker: str
    series: str = ""
    """The TV series (``TV_ID``): a series' speakers and scenes recur across its dialogues."""

    @property
    def emotional(self) -> bool:
        return self.label != "neutral"

    @property
    def strong(self) -> bool:
        return self.label in STRONG_LABELS


@dataclass(frozen=True, kw_only=True)
class Conversation:
    """One ESConv conversation: ``(speaker, text)`` turns and the seeker's initial intensity."""

    turns: tuple[tuple[str, str], ...]
    level: float | None
    situation: str = ""
    emotion_type: str = ""

    @property
    def seeker_turns(self) -> list[str]:
        return [text for speaker, text in self.turns if speaker == "usr"]


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of the file's bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def dialogue_hash(turns: Iterable[tuple[str, str]]) -> str:
    """16-hex content hash of a dialogue's ``(speaker, text)`` turns."""
    digest = hashlib.sha256()
    for speaker, text in turns:
        digest.update(f"{speaker}\t{text}\n".encode())
    return digest.hexdigest()[:16]


def detect_format(path: Path) -> str:
    """``cped`` for a .csv file, ``esconv`` otherwise."""
    return "cped" if path.suffix.lower() == ".csv" else "esconv"


def read_cped(path: Path) -> list[Utterance]:
    """Non-empty utterances of a CPED CSV (UTF-8 with BOM), in file order."""
    with path.open(encoding="utf-8-sig", newline="") as fh:
        rows = list(csv.DictReader(fh))
    missing = {"Dialogue_ID", "Speaker", "Emotion", "Utterance"} - set(rows[0] if rows else {})
    if missing:
        raise ValueError(f"{path}: not a CPED file (missing {', '.join(sorted(missing))})")
    return [
        Utterance(text=r["Utterance"], label=r["Emotion"], dialogue=r["Dialogue_ID"],
                  speaker=r["Speaker"], series=r.get("TV_ID") or r["Dialogue_ID"].split("_", 1)[0])
        for r in rows if r["Utterance"].strip()
    ]


def read_esconv(path: Path) -> list[Conversation]:
    """Conversations of an ESConv JSONL file."""
    items: list[Conversation] = []
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                turns = tuple((str(t["speaker"]), str(t["text"])) for t in obj["dialog"])
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{n}: not an ESConv line ({exc})") from None
            level = (obj.get("survey_score") or {}).get("seeker", {}).get(
                "initial_emotion_intensity")
            items.append(Conversation(
                turns=turns, level=float(level) if level not in (None, "") else None,
                situation=str(obj.get("situation") or ""),
                emotion_type=str(obj.get("emotion_type") or ""),
            ))
    return items


def utterance_dialogues(rows: Sequence[Utterance]) -> dict[str, list[int]]:
    """Row indexes of each dialogue, in file order."""
    out: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        out.setdefault(row.dialogue, []).append(i)
    return out


def cped_dialogue_hashes(rows: Sequence[Utterance]) -> list[str]:
    """`dialogue_hash` of each CPED dialogue in ``rows``."""
    return [dialogue_hash((rows[i].speaker, rows[i].text) for i in idx)
            for idx in utterance_dialogues(rows).values()]

