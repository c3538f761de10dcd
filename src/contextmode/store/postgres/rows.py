"""PostgreSQL rows into records, shared by the store and its postings (a module of its own so
that neither imports the other)."""

from __future__ import annotations

import json
from typing import Any

from ...types import Turn

__all__ = ["turn"]


def turn(row: Any) -> Turn:
    """A turn from a row (or record) of ``seq, role, content, tokens, created_at, metadata, emotion``."""
    return Turn(
        seq=row[0],
        role=row[1],
        content=row[2],
        tokens=row[3],
        created_at=row[4],
        metadata=json.loads(row[5]),
        emotion=row[6],
    )
