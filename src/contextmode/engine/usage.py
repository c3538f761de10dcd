"""What an exchange's request cost: tokens, the part a prompt cache can reuse, and money.

Worked out when the exchange's trace is kept (just after the reply, off its path): the request
as sent is compared with the previous exchange's kept request (`models.caching`), and the
engine's price table (`EngineSettings.prices`) turns the tokens into money (`contextmode.pricing`).
"""

from __future__ import annotations

from ..models.caching import cacheable_prefix_tokens, request_text
from ..pricing import PriceTable, price_for, turn_cost
from ..store.records import TurnTrace, TurnUsage
from ..tokens.base import TokenCounter
from .trace import ExchangeOutcome

__all__ = ["turn_usage"]


def turn_usage(
    trace: TurnTrace, outcome: ExchangeOutcome, previous: TurnTrace | None, *, counter: TokenCounter,
    prices: PriceTable,
) -> TurnUsage:
    """The usage of the exchange ``trace`` records (``previous``: the session's exchange before
    it, when kept), measured with ``counter`` and priced with ``prices``. The cacheable part is
    measured only between two traces kept whole (a trace cut by its size cap no longer holds
    the request as sent)."""
    prompt = outcome.reported_prompt_tokens or trace.total_tokens
    cacheable: int | None = None
    if trace.turn == 1:
        cacheable = 0
    elif previous is not None and not previous.cut and not trace.cut:
        text = request_text(trace.messages)
        shared = cacheable_prefix_tokens(request_text(previous.messages), text, counter)
        # As a share of the request as rendered, applied to its tokens as the endpoint counts them.
        cacheable = min(prompt, round(prompt * shared / max(1, counter.count(text))))
    price = price_for(trace.model, prices)
    usd: float | None = None
    if price is not None:
        cached = outcome.reported_cached_tokens if outcome.reported_cached_tokens is not None else cacheable or 0
        # The reply is priced when the endpoint reports its tokens.
        usd = round(turn_cost(price, prompt_tokens=prompt, cached_tokens=cached,
                              completion_tokens=outcome.completion_tokens or 0).usd, 8)
    before = previous.usage.session_usd if previous is not None and previous.usage is not None else None
    session = None if usd is None else round(usd + (before or 0.0), 8)
    return TurnUsage(
        prompt_tokens=prompt, cacheable_tokens=cacheable, cached_tokens=outcome.reported_cached_tokens,
        completion_tokens=outcome.completion_tokens, price_family=price.family if price else None,
        usd=usd, session_usd=session,
    )
