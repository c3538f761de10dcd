"""API keys → tenants, compared in constant time and never logged.

A request names its key with ``Authorization: Bearer <key>`` (what the openai
SDK sends) or ``X-API-Key: <key>``. With no key configured every request is
the single local tenant.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping

from .codes import Unauthorized

__all__ = ["ApiKeys"]


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


class ApiKeys:
    """Resolves the tenant of a request from its API key."""

    def __init__(self, keys: Mapping[str, str], *, local_tenant: str = "local") -> None:
        # Only digests are kept: equal-length values for compare_digest, and no raw key in memory dumps.
        self._entries = [(_digest(key), tenant) for key, tenant in keys.items()]
        self.local_tenant = local_tenant

    def __repr__(self) -> str:
        return f"ApiKeys(<{len(self._entries)} keys>)"

    @property
    def enabled(self) -> bool:
        return bool(self._entries)

    def tenant_for(self, authorization: str | None, x_api_key: str | None) -> str:
        """The tenant of the presented key; raise `Unauthorized` when it is missing or unknown."""
        if not self._entries:
            return self.local_tenant
        presented = (x_api_key or "").strip()
        if not presented and authorization:
            scheme, _, value = authorization.strip().partition(" ")
            if scheme.lower() == "bearer":
                presented = value.strip()
        if not presented:
            raise Unauthorized("an API key is required: 'Authorization: Bearer <key>' or 'X-API-Key: <key>'")
        wanted = _digest(presented)
        found: str | None = None
        # Compare against every key without stopping early, so timing says nothing about which matched.
        for digest, tenant in self._entries:
            if hmac.compare_digest(digest, wanted):
                found = tenant
        if found is None:
            raise Unauthorized("unknown API key")
        return found

    def tenant_for_headers(self, headers: Iterable[tuple[bytes, bytes]]) -> str:
        """`tenant_for` on an ASGI scope's raw headers (``Authorization``, ``X-API-Key``)."""
        found = dict(headers)
        authorization = found.get(b"authorization", b"").decode("latin-1") or None
        x_api_key = found.get(b"x-api-key", b"").decode("latin-1") or None
        return self.tenant_for(authorization, x_api_key)
