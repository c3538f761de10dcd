"""Encoding shared by the persistent backends: times, JSON, constraints, the load window.

Times are stored as integer microseconds since the Unix epoch (UTC) so they
round-trip exactly and compare as numbers in every backend.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any

from ..errors import InputError
from ..types import Constraint, NewTurn, Summary, validate_id

__all__ = [
    "being_cancelled",
    "check_owner",
    "check_user",
    "constraints_from_json",
    "constraints_to_json",
    "dumps",
    "from_micros",
    "last_answer",
    "loads_mapping",
    "metadata_json",
    "now_micros",
    "owner_error",
    "summary_fields",
    "to_micros",
    "window_start",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)


def to_micros(moment: datetime) -> int:
    """Microseconds since the epoch; a naive datetime is taken as UTC."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // _MICRO


def from_micros(micros: int) -> datetime:
    """The UTC datetime ``micros`` microseconds after the epoch."""
    return _EPOCH + timedelta(microseconds=int(micros))


def dumps(value: Any) -> str:
    """Compact JSON that keeps Chinese readable in the database."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def loads_mapping(text: str | None) -> dict[str, Any]:
    """A JSON object, or ``{}`` for ``None``/empty."""
    if not text:
        return {}
    value = json.loads(text)
    return value if isinstance(value, dict) else {}


def constraints_to_json(constraints: Sequence[Constraint]) -> str:
    return dumps([asdict(c) for c in constraints])


def constraints_from_json(text: str | None) -> tuple[Constraint, ...]:
    if not text:
        return ()
    return tuple(Constraint(**item) for item in json.loads(text))


def summary_fields(summary: Summary) -> tuple[str, int, int, int]:
    """``(text, covers_seq, tokens, created_at micros)`` of a summary."""
    return summary.text, summary.covers_seq, summary.tokens, to_micros(summary.created_at)


def check_owner(stored: str | None, given: str | None, session_id: str) -> None:
    """Raise `InputError` when ``given`` names another user than the session's ``stored`` one."""
    if given is not None and stored is not None and given != stored:
        raise owner_error(session_id)


def owner_error(session_id: str) -> InputError:
    """The error for a message naming another user than the session's."""
    return InputError(f"session {session_id!r} belongs to another user; a session never changes users")


def check_user(user_id: str | None) -> str | None:
    """Validate a user id (same rules as session ids) or pass ``None`` through."""
    return None if user_id is None else validate_id(user_id, "user id")


def last_answer(turns: Sequence[NewTurn]) -> str | None:
    """Content of the last assistant turn in ``turns`` (``None`` if there is none)."""
    for turn in reversed(turns):
        if turn.role == "assistant":
            return turn.content
    return None


def window_start(last_seq: int, covers_seq: int, recent: int, max_uncovered: int) -> int:
    """First sequence number `load()` returns verbatim.

    The tail holds every turn the summary does not cover, at least ``recent``
    turns and at most ``max_uncovered``; so its size never depends on the
    length of the history.
    """
    count = min(max(last_seq - covers_seq, recent), max(max_uncovered, 0))
    return max(1, last_seq - count + 1)


def metadata_json(metadata: Mapping[str, Any]) -> str:
    return dumps(dict(metadata))


def now_micros() -> int:
    """Now, in microseconds since the epoch (UTC)."""
    return time.time_ns() // 1000


def being_cancelled() -> bool:
    """True when the current task has a pending cancel (the driver error is its side effect)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
