"""A Redis turn document into a record and back, shared by the store and its postings (a module
of its own so that neither imports the other)."""

from __future__ import annotations

import json

from ...types import NewTurn, Turn
from .._codec import dumps, from_micros, to_micros

__all__ = ["decode_turn", "encode_turn"]


def encode_turn(turn: NewTurn) -> str:
    return dumps([turn.role, turn.content, turn.tokens, to_micros(turn.created_at),
                  dict(turn.metadata)])


def decode_turn(seq: int, doc: str, score: str | None) -> Turn:
    role, content, tokens, created, metadata = json.loads(doc)
    return Turn(seq=seq, role=role, content=content, tokens=tokens,
                created_at=from_micros(created), metadata=metadata,
                emotion=float(score) if score else None)
