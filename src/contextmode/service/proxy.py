"""What both memory proxies (`routes_openai`, `routes_anthropic`) share beyond running a turn:
any user string as an id, an app's own history adopted, side calls without memory, the
client's system messages kept with the memory notice, and a stream's first event read before
the response starts (so a rate limit is an HTTP 429, not an error inside a 200 stream).

Ids: a ``user`` (or ``metadata.user_id``, or ``X-Session-Id``) that is a valid id is used as
is; any other string (``alice@example.com``) is mapped reversibly to ``b32:`` and its UTF-8
bytes in lower-case base32 (`mapped_id`, `original_id`).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Annotated, Literal

from fastapi import Header
from fastapi.responses import JSONResponse, Response

from ..assembly.render import DEFAULT_SYSTEM_PROMPT
from ..engine import Engine, TurnEvent, TurnRequest, TurnResult, UseDefault
from ..errors import InvalidSessionId, ModelError
from ..models.base import Relay, relays
from ..types import SessionKey, validate_id
from .images import ImageFiles, decode_images
from .sse import DONE, SSEResponse, sse_event
from .state import AppState
from .turns import (
    Interrupted,
    StartedStream,
    Streamed,
    Whole,
    coalesce,
    interrupted_response,
    run_turn,
    start_events,
)

__all__ = [
    "HistoryHeader",
    "MemoryHeader",
    "ProxyChat",
    "ReplyShape",
    "accepted_first",
    "adopt_history",
    "chat_turn",
    "mapped_id",
    "original_id",
    "side_call",
    "system_prompt",
]

MemoryHeader = Annotated[
    Literal["on", "off"] | None,
    Header(alias="X-Context-Memory",
           description="'off': a side call (a title, a classification): sent to the model as is, "
                       "given no memory, nothing stored."),
]
HistoryHeader = Annotated[
    Literal["adopt", "ignore"] | None,
    Header(alias="X-Context-History",
           description="'ignore': do not import the earlier messages of a session context-mode "
                       "has not seen (by default they are imported once, in order)."),
]

_MAPPED = "b32:"
_MAX_ID = 128


def mapped_id(value: str, what: str = "session id") -> str:
    """``value`` when it is a valid id, else its reversible mapping (``b32:`` + base32 of its
    UTF-8); `InvalidSessionId` when even that is longer than 128 characters (76 bytes)."""
    try:
        return validate_id(value, what)
    except InvalidSessionId:
        pass
    encoded = _MAPPED + base64.b32encode(value.encode("utf-8", "surrogatepass")).decode().rstrip("=").lower()
    if not value or len(encoded) > _MAX_ID:
        raise InvalidSessionId(
            f"invalid {what} {value[:40]!r}: empty, or longer than 76 bytes with characters outside "
            "A-Z a-z 0-9 . _ : -"
        )
    return encoded


def original_id(value: str) -> str:
    """The string `mapped_id` was given (an id that was not mapped is returned as it is)."""
    if not value.startswith(_MAPPED):
        return value
    text = value[len(_MAPPED):].upper()
    try:
        return base64.b32decode(text + "=" * (-len(text) % 8)).decode("utf-8", "surrogatepass")
    except (binascii.Error, ValueError):
        return value


def system_prompt(texts: Sequence[str], locale: str) -> str | UseDefault | None:
    """The turn's system prompt from the client's ``system`` / ``developer`` messages, every one
    in order, then the engine's sentence that the memory sections are reference data, not
    instructions (a client prompt never removes it). No system message: the engine's own."""
    if not texts:
        return UseDefault.USE_DEFAULT
    lang = "zh" if locale.startswith("zh") else "en"
    return "\n\n".join([*(t for t in texts if t.strip()), DEFAULT_SYSTEM_PROMPT[lang]])


async def adopt_history(
    engine: Engine, key: SessionKey, history: Sequence[tuple[Literal["user", "assistant"], str]],
    user_id: str | None,
) -> int:
    """Store an app's own earlier messages on a session that holds no turn yet (the proxy was
    put in front of an app that keeps its history); returns how many were stored. A session
    that holds turns keeps them: the client's copy is not imported again."""
    kept = [(role, text) for role, text in history if text.strip()]
    if not kept:
        return 0
    state = await engine.store.load(key, recent=1)
    if state.turns:
        return 0
    for role, text in kept:
        await engine.record(key.tenant, key.session_id, role, text, metadata={"adopted": True}, user_id=user_id)
    return len(kept)


def accepted_first(
    engine: Engine, stream: AsyncIterator[TurnEvent], relay: Relay | None, headers: dict[str, str]
) -> AsyncIterator[TurnEvent]:
    """A relayed turn's events (``relay`` set, a model that `relays`), ``Prepared`` held back
    until the model endpoint has answered: its acceptance (the headers it passes on go into
    ``headers``), or its failure before saying anything, raised instead (the caller answers with
    its status: a 429 stays a 429, not an error inside a ``200`` stream). Any other turn's
    ``stream`` as it is: its first event after ``Prepared`` is its first token, which the
    response must not wait for."""
    if relay is None or not relays(engine.model):
        return stream
    return _accepted_first(stream, headers)


async def _accepted_first(stream: AsyncIterator[TurnEvent], headers: dict[str, str]) -> AsyncIterator[TurnEvent]:
    try:
        prepared = await anext(stream)
        following = await anext(stream, None)
        if following is not None and following.kind == "failed" and not following.partial_answer:
            raise following.error
        if following is not None and following.kind == "upstream":
            headers.update(following.reply.headers)
        yield prepared
        if following is not None:
            yield following
        async for event in stream:
            yield event
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


@dataclass(frozen=True, kw_only=True)
class ReplyShape:
    """How a proxy writes a chat turn's answer (OpenAI's chat completions, its Responses API)."""

    path: str
    """The route (its error shape)."""
    json: Callable[[TurnResult], Response]
    """The whole answer's response."""
    sse: Callable[[StartedStream, AsyncIterator[TurnEvent]], AsyncIterator[bytes]]
    """A started stream's events (from the first after ``Prepared``) as the route's SSE bytes."""
    headers: dict[str, str] = field(default_factory=dict, hash=False)
    """The response's headers, the very dict the route gives `serve_once`: a relayed stream
    adds the endpoint's (``x-request-id``) to it before the response starts."""


@dataclass(frozen=True, kw_only=True)
class ProxyChat:
    """A chat turn of a proxy: the engine's request and what the route adds around it."""

    request: TurnRequest
    image_urls: list[str]
    """The message's images (``data:`` URLs), checked by the image boundary before the turn."""
    history: Sequence[tuple[Literal["user", "assistant"], str]] = ()
    """The client's earlier messages, adopted when the session holds none (`adopt_history`)."""


def chat_turn(chat: ProxyChat, state: AppState, shape: ReplyShape) -> tuple[Whole, Streamed]:
    """`serve_turn`'s runners for a proxy's chat turn: images decoded now and written when it
    runs, the client's history adopted first, a model that failed before saying anything
    answered with its own status (a 429 stays a 429), the answer written by ``shape``."""
    request, engine = chat.request, state.engine
    decoded = decode_images(chat.image_urls, state.settings)

    async def with_images() -> tuple[TurnRequest, ImageFiles]:
        await adopt_history(engine, request.key, chat.history, request.user_id)
        images = ImageFiles.write(decoded, state.settings.image_dir)
        return replace(request, images=images.refs()), images

    async def whole() -> Response:
        turn, images = await with_images()
        try:
            result = await run_turn(engine, turn, images=images, metrics=state.metrics)
        except Interrupted as stop:
            if not stop.partial:
                raise stop.error from None  # nothing was said: the endpoint's status stands
            return interrupted_response(shape.path, stop)
        return shape.json(result)

    async def streamed() -> tuple[StartedStream, AsyncIterator[bytes]]:
        turn, images = await with_images()
        stream = accepted_first(engine, engine.stream(turn), turn.relay, shape.headers)
        mode = turn.mode or engine.settings.mode
        started = await start_events(stream, mode, images=images, metrics=state.metrics)
        settings = state.settings
        events = coalesce(started.events, flush_ms=settings.stream_flush_ms, flush_bytes=settings.stream_flush_bytes)
        return started, shape.sse(started, events)

    return whole, streamed


async def side_call(engine: Engine, relay: Relay, headers: Mapping[str, str], ping_s: float) -> Response:
    """A call the app marked as a side call (``X-Context-Memory: off``): its messages go to the
    model as the app sent them, the reply comes back as the model sent it, nothing is stored."""
    model = engine.model
    if not relays(model):
        raise ModelError("this server's model cannot take a request as the app composed it")
    events = model.relay(None, relay)
    if not relay.stream:
        async for event in events:
            if event.kind == "upstream":
                return JSONResponse(dict(event.data), headers={**headers, **event.headers})
        raise ModelError("the model endpoint sent no completion")
    first = await anext(events)  # an error before the stream starts is answered with its status
    first_headers = first.headers if first.kind == "upstream" else {}

    async def body() -> AsyncIterator[bytes]:
        try:
            for event in [first]:
                if event.kind == "upstream" and not event.accepted_only:
                    yield sse_event(dict(event.data))
            async for event in events:
                if event.kind == "upstream" and not event.accepted_only:
                    yield sse_event(dict(event.data))
        finally:
            await events.aclose()  # type: ignore[attr-defined]
        yield DONE

    return SSEResponse(body(), headers={**headers, **first_headers}, ping_s=ping_s)
