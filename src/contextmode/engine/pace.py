"""How long replies take: the yardstick of the response path's budget.

Detection and rewriting by a model run before the reply, on the same server. On a fast hosted
model they cost a fraction of a second; on a small local model one call can take longer than a
short reply (a rewrite prompt of 600 tokens is ~3.5 s of prompt evaluation for SmolLM2-135M on
two cores). So the memory calls of a turn's response path share one budget, relative to the
session's typical reply (`EngineSettings.response_share`, never less than
`EngineSettings.response_min_s`): past it the offline processors decide, the user's words go on
as they are or as the offline rewriter verified them, and the trace says so (issue "the reply
first", docs/models.md).
"""

from __future__ import annotations

import statistics
from collections import OrderedDict, deque

from ..types import SessionKey

__all__ = ["ReplyPace"]


class ReplyPace:
    """The model's time of the newest replies: per session its newest `KEEP`, and the engine's
    newest `KEEP_ALL` (for a session with none yet). Bounded: `SESSIONS` sessions, least
    recently answered dropped first."""

    KEEP = 5
    KEEP_ALL = 32
    SESSIONS = 4096

    def __init__(self) -> None:
        self._sessions: OrderedDict[SessionKey, deque[float]] = OrderedDict()
        self._all: deque[float] = deque(maxlen=self.KEEP_ALL)

    def record(self, key: SessionKey, seconds: float) -> None:
        """A reply of ``key``'s took ``seconds`` (from asking the model to its last token)."""
        if seconds <= 0:
            return
        kept = self._sessions.pop(key, None) or deque(maxlen=self.KEEP)
        kept.append(seconds)
        self._sessions[key] = kept
        self._all.append(seconds)
        while len(self._sessions) > self.SESSIONS:
            self._sessions.popitem(last=False)

    def typical(self, key: SessionKey) -> float | None:
        """The median of ``key``'s newest replies; the engine's when it has none; ``None``: no
        reply yet."""
        kept = self._sessions.get(key) or self._all
        return statistics.median(kept) if kept else None

    def budget(self, key: SessionKey, *, share: float, minimum: float) -> float | None:
        """Seconds the response path's memory calls may take for ``key``'s next turn: ``share`` ×
        its typical reply, at least ``minimum``; ``None`` (no budget: each call keeps its own
        timeout) when ``share`` is 0 or no reply was measured yet."""
        typical = self.typical(key)
        if share <= 0 or typical is None:
            return None
        return max(minimum, share * typical)

    def forget(self, key: SessionKey) -> None:
        """Drop what is kept of ``key`` (the session was deleted)."""
        self._sessions.pop(key, None)
