"""The turns waiting for background work, per session (`Backlog`): one emotion and one
constraints job per session cover every turn since the last that ran (`engine/schedule.py`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..types import SessionKey, Turn

__all__ = ["Backlog", "Due"]

log = logging.getLogger("contextmode.jobs")


@dataclass(frozen=True, kw_only=True)
class Due:
    """A user turn whose background work has not run yet."""

    turn: Turn
    earlier: list[Turn] | None
    """The turns before it as preparing it loaded them (`_loaded_before`), when it did."""


class Backlog:
    """Per session and kind of work (``emotion``, ``constraints``), the user turns not yet
    covered. A job takes them all (`take`) and puts them back when it fails (`put_back`), so its
    retry, or the next turn's job, covers them; at most `LIMIT` turns wait per session and kind
    (the oldest beyond it are dropped, with a warning)."""

    LIMIT = 64
    KINDS = ("emotion", "constraints")

    def __init__(self) -> None:
        self._due: dict[tuple[SessionKey, str], list[Due]] = {}

    def add(self, key: SessionKey, due: Due) -> None:
        for kind in self.KINDS:
            waiting = self._due.setdefault((key, kind), [])
            waiting.append(due)
            if len(waiting) > self.LIMIT:
                log.warning("%s backlog of session %s over %d turns: the oldest dropped",
                            kind, key.session_id, self.LIMIT)
                del waiting[: len(waiting) - self.LIMIT]

    def take(self, key: SessionKey, kind: str) -> list[Due]:
        return self._due.pop((key, kind), [])

    def put_back(self, key: SessionKey, kind: str, dues: list[Due]) -> None:
        waiting = self._due.setdefault((key, kind), [])
        waiting[:0] = dues
        del waiting[: max(0, len(waiting) - self.LIMIT)]

    def pending(self, key: SessionKey) -> int:
        """Turns of the session not yet covered by every kind of work."""
        return max((len(self._due.get((key, kind), ())) for kind in self.KINDS), default=0)

    def forget(self, key: SessionKey) -> None:
        for kind in self.KINDS:
            self._due.pop((key, kind), None)
