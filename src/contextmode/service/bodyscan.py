"""Counting a JSON body's keys and items while it arrives, without parsing it.

A body of a million keys is parsed in a second and validated in many more,
holding the event loop for every tenant. `JsonShape` counts the structural
``,`` and ``:`` (outside strings) of each chunk as it is received, with a few
C-level byte operations per chunk, so the edge refuses such a body after its
first few hundred kilobytes, before anything parses it.
"""

from __future__ import annotations

import re

__all__ = ["JsonShape"]

_BRACKETS = re.compile(rb"[\[\]{}]")


class JsonShape:
    """Running count of the separators outside strings (≈ keys + array items) of a JSON body,
    and its nesting depth."""

    def __init__(self) -> None:
        self.separators = 0
        self.depth = 0
        """Nesting depth at the end of the bytes seen so far."""
        self.deepest = 0
        """Deepest nesting seen so far (a bound is checked first; brackets are walked only when it may grow)."""
        self._in_string = False
        self._carry = b""

    def feed(self, chunk: bytes) -> int:
        """Count ``chunk`` (the next bytes of the body); return the total so far."""
        data = self._carry + chunk
        # Escaped backslashes first, then escaped quotes: neither opens nor closes a string.
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
        # A backslash at the very end escapes the first byte of the next chunk.
        self._carry = b"\\" if data.endswith(b"\\") else b""
        if self._carry:
            data = data[:-1]
        parts = data.split(b'"')
        outside = b"".join(parts[1::2] if self._in_string else parts[0::2])
        self.separators += outside.count(b",") + outside.count(b":")
        opens = outside.count(b"[") + outside.count(b"{")
        if self.depth + opens > self.deepest:
            for bracket in _BRACKETS.findall(outside):
                self.depth += 1 if bracket in (b"[", b"{") else -1
                self.deepest = max(self.deepest, self.depth)
        else:
            self.depth += opens - outside.count(b"]") - outside.count(b"}")
        if len(parts) % 2 == 0:  # an odd number of quotes: the string state flips
            self._in_string = not self._in_string
        return self.separators
