"""Which ``Host`` (and browser ``Origin``) names the service answers: a guard against DNS rebinding.

With no API key configured, anyone who can reach the port can read and write every
session, which is safe only on loopback. A web page can still get there: it rebinds
its own name to 127.0.0.1 (the browser then sends ``Host: evil.example``), or it posts
across origins to ``http://127.0.0.1:8000`` (the browser sends ``Origin:
https://evil.example``). So, as Jupyter does and the MCP specification advises, a request
naming another host is refused with 403 (40301) before anything else runs.

`allowed_hosts` (``CONTEXTMODE_ALLOWED_HOSTS``, comma-separated; ``*`` = any) defaults to
loopback names when no API key is set: ``localhost`` and ``*.localhost``, ``127.0.0.0/8``,
``::1``, the bind host when it is a name or address of its own, and the names RFC 6761
reserves for testing (``test``, ``*.test``), which no public DNS answers. With API keys
set the default is any host (each request needs its key anyway). An entry ``.example.com``
allows the name and its subdomains.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

from .codes import HostNotAllowed

__all__ = ["HostCheck", "default_hosts"]

LOOPBACK_NAMES = (".localhost", ".test")
"""Names (each with its subdomains) allowed without API keys: loopback and RFC 6761's test names."""

_ANY_ADDRESS = frozenset({"", "0.0.0.0", "::", "[::]"})


def default_hosts(bind_host: str, *, auth_enabled: bool) -> tuple[str, ...]:
    """The allowlist when none is configured: any host with API keys, else loopback names."""
    if auth_enabled:
        return ("*",)
    extra = () if bind_host in _ANY_ADDRESS else (bind_host,)
    return (*LOOPBACK_NAMES, *extra)


def _hostname(authority: str) -> str:
    """``"[::1]:8000"`` → ``"::1"``, ``"Example.COM:80"`` → ``"example.com"``."""
    authority = authority.strip().lower()
    if authority.startswith("["):
        return authority[1 : authority.find("]")] if "]" in authority else authority
    return authority.rsplit(":", 1)[0] if authority.count(":") == 1 else authority


def _is_loopback_address(name: str) -> bool:
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class HostCheck:
    """Allows a request by its ``Host`` and ``Origin`` headers, or raises `HostNotAllowed`."""

    def __init__(self, allowed: Iterable[str]) -> None:
        entries = [_hostname(e) if not e.strip().startswith(".") else e.strip().lower() for e in allowed]
        self.any = "*" in entries
        self._exact = {e for e in entries if not e.startswith(".")}
        self._suffixes = tuple(e for e in entries if e.startswith("."))
        self._loopback = ".localhost" in self._suffixes

    def allows(self, name: str) -> bool:
        """True when the host name (no port) may be served."""
        if self.any or name in self._exact:
            return True
        if self._loopback and _is_loopback_address(name):
            return True
        return any(name == suffix[1:] or name.endswith(suffix) for suffix in self._suffixes)

    def check(self, headers: Iterable[tuple[bytes, bytes]]) -> None:
        """Raise `HostNotAllowed` when the ``Host`` or a browser's ``Origin`` names another host."""
        if self.any:
            return
        for key, raw in headers:
            if key not in (b"host", b"origin"):
                continue
            value = raw.decode("latin-1")
            if key == b"origin":
                if value == "null":  # a sandboxed frame or a file: page
                    raise HostNotAllowed("requests from an opaque origin are not served")
                value = urlsplit(value).netloc
            name = _hostname(value)
            if not self.allows(name):
                raise HostNotAllowed(
                    f"host {name[:100]!r} is not allowed; set CONTEXTMODE_ALLOWED_HOSTS to serve it"
                )
