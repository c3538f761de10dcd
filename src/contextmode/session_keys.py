"""Any key a framework hands its memory, as a valid session id, and back.

Session ids are 1-128 characters of ``[A-Za-z0-9._:-]`` (`types.validate_id`): safe in a URL,
a Redis key and a log line. A framework's keys are the framework's business: LangChain's
``RunnableWithMessageHistory`` keyed by ``user_id`` and ``conversation_id`` gives
``user1/1-1dc5acabaf``, an app may key by an e-mail address or a Chinese name. The adapters
store such a key under `id_for_key` and show it as given (`key_for_id`):

- a key that is already a valid id is its own id (``user-42`` stays ``user-42``);
- any other key becomes `ENCODED_PREFIX` followed by the key with every character outside
  ``[A-Za-z0-9_:-]`` written as ``.<hex code point>.`` (``user1/1-1dc5acabaf`` is
  ``_.user1.2f.1-1dc5acabaf``; ``.`` itself is ``.2e.``), so the mapping is reversible and
  two keys never share an id;
- a key whose encoding would pass 128 characters keeps its first characters and ends with
  ``._`` and a hash of the whole key: still one id per key, shown as its start and ``…``.
"""

from __future__ import annotations

import hashlib
import re

from .errors import InvalidSessionId
from .types import validate_id

__all__ = ["ENCODED_PREFIX", "id_for_input", "id_for_key", "key_for_id"]

ENCODED_PREFIX = "_."
"""How an id made from a key that is not a valid id starts (a valid key starting with it is
encoded too, so ids never collide)."""
_MAX = 128
_KEPT = re.compile(r"[A-Za-z0-9_:\-]")
_HASHED = "._"
_HASH_HEX = 16
_TOKEN = re.compile(r"\.([0-9a-f]{1,6})\.|\._[0-9a-f]{16}$|(.)", re.DOTALL)
"""An encoded body read left to right: an escape, the hash that ends a cut key, a character
(a ``.`` where an escape starts is always followed by a hex digit, so ``._`` there is the hash)."""


def _valid(key: str) -> bool:
    try:
        validate_id(key)
    except InvalidSessionId:
        return False
    return True


def id_for_key(key: str) -> str:
    """The session id ``key`` is stored under (``key`` itself when it is a valid id)."""
    if _valid(key) and not key.startswith(ENCODED_PREFIX):
        return key
    pieces = [c if _KEPT.fullmatch(c) else f".{ord(c):x}." for c in key]
    encoded = ENCODED_PREFIX + "".join(pieces)
    if len(encoded) <= _MAX:
        return encoded
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_HEX]
    room = _MAX - len(ENCODED_PREFIX) - len(_HASHED) - _HASH_HEX
    kept = ""
    for piece in pieces:  # whole escapes only
        if len(kept) + len(piece) > room:
            break
        kept += piece
    return f"{ENCODED_PREFIX}{kept}{_HASHED}{digest}"


def key_for_id(session_id: str) -> str:
    """The key ``session_id`` was made from, as the framework gave it (`id_for_key`'s inverse;
    a hashed long key is shown as its start and ``…``). Any other id is its own key."""
    if not session_id.startswith(ENCODED_PREFIX):
        return session_id
    out: list[str] = []
    for token in _TOKEN.finditer(session_id, len(ENCODED_PREFIX)):
        escaped, char = token.group(1), token.group(2)
        out.append(chr(int(escaped, 16)) if escaped else char if char is not None else "…")
    return "".join(out)


def id_for_input(text: str) -> str:
    """The session a person names on the command line: an id `id_for_key` made, as is; any
    other text as a key (``user1/1-1dc5acabaf`` and ``_.user1.2f.1-1dc5acabaf`` name one session)."""
    if text.startswith(ENCODED_PREFIX) and _valid(text):
        return text
    return id_for_key(text)
