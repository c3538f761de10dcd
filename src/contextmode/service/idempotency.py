"""``Idempotency-Key``: a retried turn replays its first result instead of running twice.

A client that retries after a dropped connection or a 503 sends the same
``Idempotency-Key`` header with the same body. The first request claims the key
in the store (`IdempotencyRecords`, per tenant); a retry then gets

- the stored response again (same status and body; a stream is replayed as
  one stream, its deltas merged) with ``Idempotent-Replayed: true``, or
- ``409`` / 40904 while the first request still runs, or
- ``409`` / 40903 when the key was first used with another body or session.

A stream the client cut off (it left before the end) is kept as far as it was sent,
and its replay ends with an explicit ``error`` event, code 40905 (`StreamCutOff`), in the
route's own shape (then ``[DONE]`` where the route ends so), never silently: the turn
is not run again, since its user turn and partial answer are already stored.

A finished request's record is kept `TTL_S` (24 h), tied to its session:
erasing the session (a forget, retention) erases the record with it, so a
retry after a forget never replays the forgotten text. When a request fails
before it stored anything (validation, session busy, the store down) the key is
released so the retry runs normally; when the model failed after the user turn
was stored, the error response (with its partial answer) is what is replayed.
Keys are stored as SHA-256 digests, never as sent.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Header
from fastapi.responses import Response

from ..errors import InputError
from ..store.base import IdempotencyRecords, Store, keeps_idempotency
from .anthropic_wire import anthropic_error_body, sse
from .codes import IdempotencyKeyReused, RequestInProgress, StreamCutOff, code_for_exception
from .responses import openai_error_body
from .sse import DONE, SSEResponse, sse_event

IdempotencyKey = Annotated[
    str | None, Header(alias="Idempotency-Key", description="Retry safely: the same key and body replay the first result.")
]
"""The ``Idempotency-Key`` header of the routes that create turns."""
SessionHeader = Annotated[str | None, Header(description="The session this message belongs to.")]
"""The proxies' ``X-Session-Id`` header."""

__all__ = ["LEASE_S", "TTL_S", "Claim", "claim"]

TTL_S = 24 * 3600.0
"""How long a finished request's response is kept for retries."""
LEASE_S = 600.0
"""How long a running request holds its key if its worker dies without finishing."""

_KEY = re.compile(r"[\x21-\x7e]{1,255}")
REPLAYED = {"idempotent-replayed": "true"}


@dataclass
class Claim:
    """A key this request holds: finish it with the response, or release it."""

    store: IdempotencyRecords
    tenant: str
    key: str
    route: str = ""
    """The route's name (``sessions``, ``chat.completions``, ``messages``): the shape of its events."""
    done: bool = False
    chunks: list[bytes] = field(default_factory=list)
    mask: bool = False
    """Mask personal data in the kept response (the tenant's ``pii="mask"``)."""
    complete: bool = False
    """The recorded stream reached its end (``record`` read all of it)."""

    def _kept(self, text: str) -> str:
        if not self.mask:
            return text
        from ..text.pii import mask_pii

        return mask_pii(text).text

    async def finish(self, response: Response) -> None:
        """Keep ``response`` (a JSON response) as the answer to every retry."""
        if not self.done:
            self.done = True
            text = json.dumps({"kind": "json", "body": self._kept(bytes(response.body).decode())})
            await self.store.finish_idempotency(
                self.tenant, self.key, status=response.status_code, response=text, ttl_s=TTL_S
            )

    async def finish_stream(self) -> None:
        """Keep the events sent so far (``record`` collected them) as the replayed stream."""
        if not self.done:
            self.done = True
            chunks = self.chunks if self.complete else [*self.chunks, *cut_off_tail(self.route)]
            text = json.dumps({"kind": "sse", "events": [self._kept(c.decode()) for c in chunks]})
            await self.store.finish_idempotency(self.tenant, self.key, status=200, response=text, ttl_s=TTL_S)

    async def release(self) -> None:
        if not self.done:
            self.done = True
            await self.store.release_idempotency(self.tenant, self.key)

    async def record(self, events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """Pass ``events`` through, keeping a copy for `finish_stream`."""
        async for chunk in events:
            if not chunk.startswith(b":"):  # keep-alive comments are not part of the answer
                self.chunks.append(chunk)
            yield chunk
        self.complete = True


CUT_OFF_MSG = (
    "the first response to this Idempotency-Key was cut off here (the client left before its end); "
    "the turn is stored as far as it got and is not run again"
)


def cut_off_tail(route: str) -> list[bytes]:
    """The events that end the replay of a cut-off stream, in ``route``'s shape."""
    row = code_for_exception(StreamCutOff())
    if route == "messages":  # Anthropic's stream: an error event ends it
        return [sse("error", anthropic_error_body(row.code, row.name, CUT_OFF_MSG))]
    if route == "chat.completions":
        return [sse_event(openai_error_body(row.code, row.name, CUT_OFF_MSG)), DONE]
    return [sse_event({"type": "error", "code": row.code, "msg": CUT_OFF_MSG, "partial": True}), DONE]


def fingerprint(parts: Sequence[str]) -> str:
    """Digest of what makes two requests "the same": route, session and canonical body."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode("utf-8", "surrogatepass"))
        digest.update(b"\x00")
    return digest.hexdigest()


async def claim(
    store: Store, tenant: str, header: str | None, parts: Sequence[str], *, session_id: str, mask: bool = False
) -> tuple[Claim | None, Response | None]:
    """Claim ``header``'s key for this request: ``(claim, None)`` to run it,
    ``(None, response)`` to replay, ``(None, None)`` without a key (or a store without records).

    The record is tied to ``session_id``: erasing the session erases it. With ``mask`` the
    kept response has its personal data masked (a replay shows it masked).

    Raises `IdempotencyKeyReused` (40903) or `RequestInProgress` (40904).
    """
    if header is None or not keeps_idempotency(store):
        return None, None
    if not _KEY.fullmatch(header):
        raise InputError("Idempotency-Key must be 1-255 printable ASCII characters without spaces")
    key = hashlib.sha256(header.encode()).hexdigest()
    wanted = fingerprint(parts)
    record = await store.claim_idempotency(tenant, key, wanted, session_id=session_id, lease_s=LEASE_S)
    if record is None:
        return Claim(store=store, tenant=tenant, key=key, mask=mask, route=parts[0] if parts else ""), None
    if record.fingerprint != wanted:
        raise IdempotencyKeyReused(
            "this Idempotency-Key was used with another request; use a new key for a new request"
        )
    if record.status == 0:
        raise RequestInProgress("the first request with this Idempotency-Key is still running; retry later")
    return None, _replay(record.status, record.response)


def _replay(status: int, stored: str) -> Response:
    saved = json.loads(stored)
    if saved.get("kind") == "sse":
        return SSEResponse(_events(saved["events"]), headers=REPLAYED)
    return Response(saved["body"], status_code=status, media_type="application/json", headers=REPLAYED)


async def _events(events: list[str]) -> AsyncIterator[bytes]:
    for event in events:
        yield event.encode()
