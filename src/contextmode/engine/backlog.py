"""The turns waiting for background work, per session (`Backlog`): one unit of work per session
(`engine/schedule.py`, job ``memory``) covers every turn since the last that ran: their emotion,
their constraints and, when one is due, the summary."""

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
    covered, and the summary due, if one is. A step of the session's unit takes them all
    (`take`, `take_summary`) and puts them back when it fails (`put_back`, `want_summary`), so
    the unit's next pass, its retry or the next turn's unit covers them; at most `LIMIT` turns
    wait per session and kind (the oldest beyond it are dropped, with a warning).

    `covering` says a unit is running and will look at the backlog again before it ends: a new
    turn then merges into it, and no second unit is scheduled."""

    LIMIT = 64
    KINDS = ("emotion", "constraints")

    def __init__(self) -> None:
        self._due: dict[tuple[SessionKey, str], list[Due]] = {}
        self._summary: dict[SessionKey, int] = {}
        self._covering: set[SessionKey] = set()

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

    def want_summary(self, key: SessionKey, upto: int) -> None:
        """A summary is due, reaching turn ``upto`` at least (0: the usual range)."""
        self._summary[key] = max(upto, self._summary.get(key, 0))

    def take_summary(self, key: SessionKey) -> int | None:
        """The summary due (the turn it must reach, 0: the usual range), or ``None``."""
        return self._summary.pop(key, None)

    def has_work(self, key: SessionKey) -> bool:
        return key in self._summary or any(self._due.get((key, kind)) for kind in self.KINDS)

    def covering(self, key: SessionKey) -> bool:
        """True while a unit of the session runs and will look at the backlog again."""
        return key in self._covering

    def cover(self, key: SessionKey, on: bool) -> None:
        """A unit of the session starts (``on``) or stops looking at the backlog."""
        if on:
            self._covering.add(key)
        else:
            self._covering.discard(key)

    def pending(self, key: SessionKey) -> int:
        """Turns of the session not yet covered by every kind of work."""
        return max((len(self._due.get((key, kind), ())) for kind in self.KINDS), default=0)

    def forget(self, key: SessionKey) -> None:
        for kind in self.KINDS:
            self._due.pop((key, kind), None)
        self._summary.pop(key, None)
