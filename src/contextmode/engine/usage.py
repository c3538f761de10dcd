"""What an exchange's request cost: tokens, the part a prompt cache can reuse, and money.

Worked out when the exchange's trace is kept (just after the reply, off its path): the request
as sent is compared with the previous exchange's kept request (`models.caching`), and the
engine's price table (`EngineSettings.prices`) turns the tokens into money (`contextmode.pricing`).
What the next exchange needs of a kept trace (`UsageBasis`) is remembered per session
(`KeptRequests`), so the usual turn does not read the previous trace back from the store.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ..models.caching import cacheable_prefix_tokens, request_text
from ..pricing import PriceTable, price_for, turn_cost
from ..store.records import TurnTrace, TurnUsage
from ..tokens.base import TokenCounter
from ..types import SessionKey
from .trace import ExchangeOutcome

__all__ = ["KeptRequests", "UsageBasis", "turn_usage"]


@dataclass(frozen=True, kw_only=True, slots=True)
class UsageBasis:
    """What the next exchange's usage reads of a kept trace."""

    request: str | None
    """Its request as sent (`request_text` of its messages); ``None`` when the trace was cut by
    its size cap (it no longer holds the request as sent)."""
    session_usd: float | None
    """The session's money up to that exchange, when it was priced."""

    @classmethod
    def of(cls, trace: TurnTrace, request: str | None = None) -> UsageBasis:
        """What ``trace`` gives; ``request``: its `request_text`, when the caller has it rendered."""
        if trace.cut:
            request = None
        elif request is None:
            request = request_text(trace.messages)
        return cls(request=request, session_usd=trace.usage.session_usd if trace.usage is not None else None)


def turn_usage(
    trace: TurnTrace, outcome: ExchangeOutcome, previous: UsageBasis | None, *, counter: TokenCounter,
    prices: PriceTable, request: str | None = None,
) -> TurnUsage:
    """The usage of the exchange ``trace`` records (``previous``: what the session's exchange
    before it kept, when kept), measured with ``counter`` and priced with ``prices``. The
    cacheable part is measured only between two traces kept whole (a trace cut by its size cap
    no longer holds the request as sent). ``request``: the trace's `request_text`, when the
    caller has it rendered (the trace write renders it once for this and `UsageBasis`)."""
    prompt = outcome.reported_prompt_tokens or trace.total_tokens
    cacheable: int | None = None
    if trace.turn == 1:
        cacheable = 0
    elif previous is not None and previous.request is not None and not trace.cut:
        text = request if request is not None else request_text(trace.messages)
        shared = cacheable_prefix_tokens(previous.request, text, counter)
        # As a share of the request as rendered, applied to its tokens as the endpoint counts them.
        cacheable = min(prompt, round(prompt * shared / max(1, counter.count(text))))
    price = price_for(trace.model, prices)
    usd: float | None = None
    if price is not None:
        cached = outcome.reported_cached_tokens if outcome.reported_cached_tokens is not None else cacheable or 0
        # The reply is priced when the endpoint reports its tokens.
        usd = round(turn_cost(price, prompt_tokens=prompt, cached_tokens=cached,
                              completion_tokens=outcome.completion_tokens or 0).usd, 8)
    before = previous.session_usd if previous is not None else None
    session = None if usd is None else round(usd + (before or 0.0), 8)
    return TurnUsage(
        prompt_tokens=prompt, cacheable_tokens=cacheable, cached_tokens=outcome.reported_cached_tokens,
        completion_tokens=outcome.completion_tokens, price_family=price.family if price else None,
        usd=usd, session_usd=session,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class _Kept:
    keeper: object
    """The trace store it was kept in (a store swapped on a live engine is another)."""
    session_created: datetime | None
    """The session's creation time (a session erased and made again is another)."""
    turn: int
    last_seq: int
    """The newest turn the exchange stored (its answer)."""
    basis: UsageBasis


class KeptRequests:
    """Per session, what the next exchange's usage needs of the newest trace this process kept
    (`UsageBasis`), so it is not read back from the store. Bounded (the oldest session goes
    past 512); an erasure drops the session's (`Engine.forget_local`).

    A remembered basis is used only when it is certainly what the store holds: the same trace
    store and session (its creation time), the exchange just before, and this exchange's user
    turn right after that exchange's answer. Only a trace of an exchange that stored an answer
    is remembered: any other process that kept a trace for the same exchange number (a retried
    request after a reply that never came) would have appended turns in between.
    """

    _LIMIT = 512

    def __init__(self) -> None:
        self._by_session: dict[SessionKey, _Kept] = {}

    def basis(
        self, key: SessionKey, keeper: object, *, turn: int, user_seq: int, session_created: datetime | None
    ) -> UsageBasis | None:
        """The basis of exchange ``turn - 1``'s kept trace, for exchange ``turn`` whose user turn
        is ``user_seq``; ``None`` when not remembered (read the trace from the store)."""
        kept = self._by_session.get(key)
        if (kept is None or kept.keeper is not keeper or kept.session_created is None
                or kept.session_created != session_created or kept.turn != turn - 1
                or kept.last_seq + 1 != user_seq):
            return None
        return kept.basis

    def keep(
        self, key: SessionKey, keeper: object, trace: TurnTrace, *, last_seq: int, session_created: datetime | None,
        request: str | None = None,
    ) -> None:
        """Remember what ``trace`` (as it was kept) gives the next exchange's usage (``request``:
        its `request_text`, when the caller has it rendered)."""
        self._by_session.pop(key, None)  # newest last: the oldest goes first
        if len(self._by_session) >= self._LIMIT:
            del self._by_session[next(iter(self._by_session))]
        self._by_session[key] = _Kept(keeper=keeper, session_created=session_created, turn=trace.turn,
                                      last_seq=last_seq, basis=UsageBasis.of(trace, request))

    def forget(self, tenant: str, session_id: str) -> bool:
        """Drop the session's; True when there was one."""
        return self._by_session.pop(SessionKey(tenant, session_id), None) is not None
