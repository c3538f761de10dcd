"""SQLite rows into records: the turn select and its decoder, shared by the store and its postings
(a module of its own so that neither imports the other)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...types import Turn
from .._codec import from_micros, loads_mapping

__all__ = ["TURN_SELECT", "turn"]

TURN_SELECT = (
    "SELECT t.seq, t.role, t.content, t.tokens, t.created_at, t.metadata, e.emotion FROM turns t"
    " LEFT JOIN turn_emotions e ON e.tenant = t.tenant AND e.session_id = t.session_id"
    " AND e.seq = t.seq WHERE t.tenant = ? AND t.session_id = ?"
)


def turn(row: Sequence[Any]) -> Turn:
    return Turn(
        seq=row[0],
        role=row[1],
        content=row[2],
        tokens=row[3],
        created_at=from_micros(row[4]),
        metadata=loads_mapping(row[5]),
        emotion=row[6],
    )
