"""Step 2 of a turn, and the turn's whole path: prepare → store the user turn → stream the
model's answer → store it → schedule the jobs.

The user turn is stored before the ``Prepared`` event (on the store connection preparing
used) and so before the model is called; the answer after, marked
partial if the stream broke, in a ``finally`` that cancellation cannot skip. A
`ModelError` ends the stream with a `Failed` event once the partial answer is safe.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass

from ..errors import ModelError
from ..models.base import UpstreamReply, relays
from ..models.caching import ModelUsage, cache_session, collect_usage, usage_from
from ..models.calls import call_log
from ..text.degenerate import ReplyGuard, scripts_of
from ..types import Turn
from .parts import TurnParts
from .persist import Answer, store_answer, store_user_turn
from .prepare import prepare_turn
from .request import (
    Delta,
    Done,
    Failed,
    Prepared,
    PreparedTurn,
    TurnEvent,
    TurnRequest,
    TurnResult,
    Upstream,
)
from .schedule import schedule_jobs

__all__ = ["Ending", "stream_turn"]

log = logging.getLogger("contextmode.turn")


async def stream_turn(parts: TurnParts, request: TurnRequest) -> AsyncIterator[TurnEvent]:
    """`Engine.stream`: ``Prepared``, then ``Delta`` events, then ``Done`` (or ``Failed``)."""
    started = time.perf_counter()
    since = time.monotonic()  # the model calls overlapping the turn go in its trace
    # Loading, recalling and storing the user turn share one pooled store connection (with the
    # service's turn lock: its scope), handed back before the model answers.
    async with parts.one_connection():
        prepared = await prepare_turn(parts, request)
        user_turn = await store_user_turn(parts, request, prepared)
        await parts.let_go()
    pieces: list[str] = []
    ttft: float | None = None
    error: ModelError | None = None
    completed = False
    ending = Ending()
    model_started = time.perf_counter()
    reported: list[ModelUsage] = []
    try:
        # Closed here (the client left before the model was asked): the finally below runs as
        # for a stream cut before its first token.
        yield Prepared(prepared=prepared)
        # The model call carries the session's prompt-cache hints, and reports its usage here.
        with cache_session(request.key.tenant, request.key.session_id), collect_usage() as reported:
            async for event in _answer(parts, request, prepared, ending):
                if event.kind == "delta":
                    if ttft is None:
                        ttft = (time.perf_counter() - started) * 1000
                    pieces.append(event.text)
                yield event
        completed = True
        parts.pace.record(request.key, time.perf_counter() - model_started)
    except ModelError as exc:
        error = exc
    finally:
        answer = Answer(
            text="".join(pieces), partial=not completed, ttft_ms=ttft,
            model_ms=(time.perf_counter() - model_started) * 1000,
            usage=usage_from(ending.usage) if ending.usage is not None else (reported[-1] if reported else None),
            model_calls=call_log().between(since), stopped=ending.stopped,
        )
        assistant_turn = await asyncio.shield(store_answer(parts, request.key, user_turn, answer, prepared))
        jobs = schedule_jobs(parts, request.key, user_turn, prepared)
        _log_turn(prepared, user_turn, answer, jobs)
    if error is not None:
        yield Failed(error=error, partial_answer=answer.text, prepared=prepared)
        return
    result = TurnResult(
        answer=answer.text,
        partial=answer.partial,
        user_turn=user_turn,
        assistant_turn=assistant_turn,
        prepared=prepared,
        jobs=jobs,
        ttft_ms=ttft,
        model_ms=answer.model_ms,
        finish_reason=ending.finish_reason,
        stop_sequence=ending.stop_sequence,
        usage=ending.usage,
        reported=answer.usage,
        upstream=ending.whole,
    )
    yield Done(result=result)


@dataclass
class Ending:
    """How a relayed reply ended, read from what the endpoint sent (`_answer`)."""

    finish_reason: str | None = None
    stop_sequence: str | None = None
    usage: Mapping[str, object] | None = None
    whole: UpstreamReply | None = None
    """The whole completion of a relayed request that is not streamed."""
    stopped: str | None = None
    """Why the engine stopped the reply early (it degenerated, `text.degenerate`)."""

    def read(self, reply: UpstreamReply, *, whole: bool) -> None:
        data = reply.data
        if whole:
            self.whole = reply
        usage = data.get("usage")
        if isinstance(usage, Mapping):
            self.usage = usage
        for choice in data.get("choices") or ():  # type: ignore[attr-defined]
            if isinstance(choice, Mapping) and not choice.get("index") and choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
                matched = choice.get("stop_reason")  # vLLM names the stop string it met
                self.stop_sequence = matched if isinstance(matched, str) and matched else None


async def _answer(
    parts: TurnParts, request: TurnRequest, prepared: PreparedTurn, ending: Ending
) -> AsyncIterator[Delta | Upstream]:
    """The model's answer as ``Delta`` events; for a relayed request (`TurnRequest.relay`, a model
    that `relays`) the endpoint's own replies too, as ``Upstream`` events, each before its text,
    the reply capped at what the context window leaves."""
    model, relay = parts.model, request.relay
    if relay is None or not relays(model):
        guard = ReplyGuard(scripts_of(m.content for m in prepared.messages))
        deltas = model.stream(prepared.messages, max_tokens=reply_cap(parts, prepared))
        try:
            async for delta in deltas:
                yield Delta(text=delta)
                if (why := guard.feed(delta)) is not None:
                    log.warning("reply stopped early in session %s: %s", request.key.session_id, why)
                    ending.stopped = why
                    return
        finally:
            if isinstance(deltas, AsyncGenerator):  # closed now: the server stops generating
                await deltas.aclose()
        return
    async for event in model.relay(prepared.messages, relay, max_tokens=max(1, window_left(parts, prepared))):
        if event.kind == "upstream":
            if not event.accepted_only:
                ending.read(event, whole=not relay.stream)
            yield Upstream(reply=event)
        elif event.kind == "text":
            yield Delta(text=event.text)


ESTIMATE_MARGIN = 0.1
"""Share of an estimated prompt kept free besides it: an estimate (`EstimateCounter`, for a model
whose tokenizer we cannot run) may count a few percent low, and a server refuses a request whose
prompt and ``max_tokens`` together exceed its window (llama-cpp-python: "Requested tokens (4170)
exceed context window of 4096", every later turn of the session with it)."""


def window_left(parts: TurnParts, prepared: PreparedTurn) -> int:
    """Tokens the context window leaves after the turn's prompt: its count, plus
    `ESTIMATE_MARGIN` of it when counts are estimates (may be 0 or less)."""
    prompt = prepared.context.total_tokens
    if not parts.counter.exact:
        prompt = math.ceil(prompt * (1 + ESTIMATE_MARGIN))
    return parts.settings.context_window - prompt


def reply_cap(parts: TurnParts, prepared: PreparedTurn) -> int | None:
    """``max_tokens`` of the reply when counts are estimates and the window is nearly full: what
    the window leaves (`window_left`), if that is less than the reply's reserve; else ``None``
    (the model's own cap). A relayed request is always capped at what the window leaves."""
    if parts.counter.exact:
        return None
    left = window_left(parts, prepared)
    return max(1, left) if left < parts.budget().reserve else None


def _log_turn(prepared: PreparedTurn, user_turn: Turn, answer: Answer, jobs: list[str]) -> None:
    if not log.isEnabledFor(logging.INFO):  # the line and its fields are not built for nothing
        return
    ctx = prepared.context
    ttft = answer.ttft_ms
    rewritten = bool(prepared.rewrite and prepared.rewrite.changed)
    log.info(
        "turn session=%s seq=%d %s rewritten=%s partial=%s ttft_ms=%s model_ms=%.1f jobs=%s",
        prepared.state.session_id,
        user_turn.seq,
        ctx.summary_line(),
        rewritten,
        answer.partial,
        f"{ttft:.1f}" if ttft is not None else "-",
        answer.model_ms,
        ",".join(jobs),
        extra={
            "session": prepared.state.session_id,
            "tenant": prepared.state.tenant,
            "tokens": {name: a.used for name, a in ctx.accounts.items()},
            "total_tokens": ctx.total_tokens,
            "exact_tokens": ctx.exact,
            "rewritten": rewritten,
            "ttft_ms": ttft,
            "model_ms": answer.model_ms,
            "jobs": jobs,
        },
    )
