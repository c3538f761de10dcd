"""A reply that has stopped saying anything: it loops, or it drifts into a script the
conversation does not use. Small local models do both (SmolLM2-135M loops in Chinese until its
token cap); the engine stops such a reply early and the turn ends with what was said
(`engine.stream`).

`ReplyGuard` is fed the reply as it streams and says why to stop, or ``None``:

- a verbatim loop (`is_looping`: the same unit three times, over 200 characters);
- a loop with small variations: in the newest `_TAIL` characters, fewer than half of the
  6-character pieces are distinct (a sentence repeated with a number changed: about a third;
  news prose in Chinese: three quarters and more);
- a script drift: of the newest 120 letters, at least 100 are of a script (Cyrillic, Hangul,
  Arabic…) the conversation never used (its messages, memory and the script most of the reply's
  opening is in). Latin
  letters and digits always count as used (names, numbers, code in any conversation).

A reply is checked every `_EVERY` new characters, so the guard costs little on a long reply.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable

__all__ = ["ReplyGuard", "is_looping", "scripts_of"]

_LOOP_MIN_CHARS = 200
_LOOP_MAX_PERIOD = 300


def is_looping(text: str) -> bool:
    """True when ``text`` ends in the same unit repeated verbatim: 3 times or more, over 200
    characters or more, for any unit of up to 300 characters.

    Small models loop (the same sentence, in Chinese especially) until the
    server's context is full; a reply doing so is cut and ends as ``length``.
    Works on characters, so for every script; prose with a repeated phrase is
    not periodic and is left alone.
    """
    if len(text) < _LOOP_MIN_CHARS:
        return False
    for period in range(1, min(_LOOP_MAX_PERIOD, len(text) // 3) + 1):
        span = max(3 * period, _LOOP_MIN_CHARS)
        if span > len(text):
            break
        tail = text[-span:]
        if tail[period:] == tail[:-period] and not tail[-period:].isspace():
            return True
    return False


_EVERY = 48
_TAIL = 360
_PIECE = 6
_DISTINCT_MIN = 0.5
_DRIFT_LETTERS = 120
_DRIFT_MIN = 100


def _script(char: str) -> str | None:
    """The script of a letter (``latin``, ``han``, ``cyrillic``…), ``None`` for anything else."""
    if not char.isalpha():
        return None
    code = ord(char)
    if code < 0x250 or 0x1E00 <= code < 0x1F00:
        return "latin"
    if 0x3040 <= code < 0x3100 or 0x31F0 <= code < 0x3200:
        return "kana"
    if 0x3400 <= code < 0xA000 or 0xF900 <= code < 0xFB00 or 0x20000 <= code < 0x2FA20:
        return "han"
    if 0xFF21 <= code < 0xFF5B:
        return "latin"  # full-width Latin
    try:
        name = unicodedata.name(char)
    except ValueError:
        return None
    return name.split(" ", 1)[0].lower()


def scripts_of(texts: Iterable[str]) -> frozenset[str]:
    """The scripts the letters of ``texts`` are written in, Latin always included."""
    chars: set[str] = set()
    for text in texts:
        chars.update(text)  # each distinct character once (a context repeats most of them)
    found = {"latin"}
    for char in chars:
        if (script := _script(char)) is not None:
            found.add(script)
    return frozenset(found)


class ReplyGuard:
    """Watches a streaming reply (`feed`) for degeneration; ``used``: the conversation's scripts."""

    def __init__(self, used: frozenset[str]) -> None:
        self.used = set(used)
        self.text = ""
        self._checked = 0
        self._start_read = False

    def feed(self, delta: str) -> str | None:
        """Add ``delta``; why the reply should stop now, or ``None``."""
        self.text += delta
        if len(self.text) - self._checked < _EVERY:
            return None
        self._checked = len(self.text)
        if not self._start_read and len(self.text) >= _EVERY:
            # The reply's own opening is the conversation's too (a model answering in the
            # user's script is never cut for it).
            opening = [s for s in map(_script, self.text[:_EVERY]) if s is not None]
            self.used |= {s for s in set(opening) if 2 * opening.count(s) > len(opening)}
            self._start_read = True
        return self.why()

    def why(self) -> str | None:
        text = self.text
        if is_looping(text):
            return "the reply repeats itself"
        tail = text[-_TAIL:]
        if len(tail) == _TAIL:
            pieces = [tail[i : i + _PIECE] for i in range(0, len(tail) - _PIECE + 1)]
            if len(set(pieces)) < _DISTINCT_MIN * len(pieces):
                return "the reply keeps repeating the same phrases"
        letters = [s for s in (_script(c) for c in reversed(text[-4 * _DRIFT_LETTERS :])) if s is not None]
        letters = letters[:_DRIFT_LETTERS]
        if len(letters) == _DRIFT_LETTERS:
            foreign = [s for s in letters if s not in self.used]
            if len(foreign) >= _DRIFT_MIN:
                script = max(set(foreign), key=foreign.count)
                return f"the reply turned to a script the conversation does not use ({script})"
        return None
