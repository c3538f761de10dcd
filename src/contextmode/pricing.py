"""What a turn costs in money: a price table per model family, and the cost of one request.

Prices change and differ by account: they live in one table, never in code paths. The shipped
table (`DEFAULT_PRICES`) holds example list prices in US dollars per million tokens, checked
2026-12 (docs/caching.md); ``CONTEXTMODE_PRICES`` names a JSON file (or holds the JSON) that
replaces it::

    {"openai": {"match": ["gpt-"], "input": 1.25, "output": 10, "cache_read": 0.1,
                "cache_write": 1.0, "min_prefix": 1024}, ...}

A request's money is ``cached · cache_read · input + (prompt − cached) · cache_write · input +
completion · output`` (per million), where ``cached`` is what the endpoint reported it read
from its cache or, when it reports nothing, the request's cacheable prefix (the tokens it
shares with the previous request of the session) when that reaches the family's minimum.
``cache_write`` is 1 where writing the cache is free (OpenAI, DeepSeek, Qwen's implicit
cache); Anthropic bills 1.25 for the 5-minute cache.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError

__all__ = ["DEFAULT_PRICES", "Price", "PriceTable", "TurnCost", "load_prices", "price_for", "turn_cost"]


@dataclass(frozen=True, kw_only=True)
class Price:
    """One model family's prices, US dollars per million tokens."""

    family: str
    """``openai``, ``anthropic``, ``deepseek``, ``qwen``, ``local``…"""
    match: tuple[str, ...] = ()
    """Model-name prefixes (lower case) of the family; the first family that matches wins."""
    input: float
    """An input token not read from the cache."""
    output: float
    """An output token."""
    cache_read: float = 1.0
    """A cached input token, as a multiple of ``input`` (0.1: a tenth of the price)."""
    cache_write: float = 1.0
    """An uncached input token that is written to the cache, as a multiple of ``input``."""
    min_prefix: int = 0
    """Tokens below which nothing is cached (the vendor's minimum)."""


PriceTable = Sequence[Price]
"""Families in the order they are matched."""

DEFAULT_PRICES: tuple[Price, ...] = (
    Price(family="anthropic", match=("claude",), input=3.0, output=15.0, cache_read=0.1, cache_write=1.25,
          min_prefix=1024),
    Price(family="openai", match=("gpt-", "o1", "o3", "o4", "chatgpt"), input=1.25, output=10.0, cache_read=0.1,
          min_prefix=1024),
    Price(family="deepseek", match=("deepseek",), input=0.28, output=0.42, cache_read=0.1, min_prefix=64),
    Price(family="qwen", match=("qwen",), input=0.4, output=1.2, cache_read=0.2, min_prefix=256),
)
"""Example list prices (USD per million tokens, 2026-12): Claude Sonnet, GPT-5, DeepSeek V3.2,
Qwen-Plus. Configure your own with ``CONTEXTMODE_PRICES``."""


def price_for(model: str, table: PriceTable = DEFAULT_PRICES) -> Price | None:
    """The price of ``model``'s family (matched by name prefix), or ``None`` (a local model,
    or a family the table does not list: its turns cost nothing known)."""
    name = model.lower().rsplit("/", 1)[-1]
    return next((p for p in table if any(name.startswith(m) for m in p.match)), None)


@dataclass(frozen=True, kw_only=True)
class TurnCost:
    """One request's tokens and money."""

    cached_tokens: int
    """Input tokens billed at the cache price."""
    usd: float
    """US dollars."""


def turn_cost(price: Price, *, prompt_tokens: int, cached_tokens: int, completion_tokens: int = 0) -> TurnCost:
    """The money of one request (see the module docstring); ``cached_tokens`` below the
    family's minimum are billed as uncached."""
    cached = min(cached_tokens, prompt_tokens) if cached_tokens >= price.min_prefix else 0
    dollars = (cached * price.cache_read + (prompt_tokens - cached) * price.cache_write) * price.input
    dollars += completion_tokens * price.output
    return TurnCost(cached_tokens=cached, usd=dollars / 1_000_000)


_FIELDS = ("input", "output", "cache_read", "cache_write", "min_prefix")


def _price(family: str, spec: object) -> Price:
    if not isinstance(spec, Mapping):
        raise ConfigError(f"CONTEXTMODE_PRICES: {family!r} must be an object")
    unknown = set(spec) - {*_FIELDS, "match"}
    if unknown:
        raise ConfigError(f"CONTEXTMODE_PRICES: {family!r} has unknown fields {sorted(unknown)}")
    try:
        numbers = {k: float(spec[k]) for k in _FIELDS if k in spec}
        match = tuple(str(m).lower() for m in spec.get("match", (family,)))
        return Price(family=family, match=match, input=numbers["input"], output=numbers.get("output", 0.0),
                     cache_read=numbers.get("cache_read", 1.0), cache_write=numbers.get("cache_write", 1.0),
                     min_prefix=int(numbers.get("min_prefix", 0)))
    except KeyError:
        raise ConfigError(f"CONTEXTMODE_PRICES: {family!r} needs an input price") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"CONTEXTMODE_PRICES: {family!r}: {exc}") from None


def load_prices(value: str | None = None) -> tuple[Price, ...]:
    """The price table from ``value`` (JSON text or a path to a JSON file; default
    ``CONTEXTMODE_PRICES``), else `DEFAULT_PRICES`; `ConfigError` naming what is wrong."""
    value = os.environ.get("CONTEXTMODE_PRICES") if value is None else value
    if not value or not value.strip():
        return DEFAULT_PRICES
    text = value if value.lstrip().startswith("{") else _read(value)
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"CONTEXTMODE_PRICES is not valid JSON: {exc}") from None
    if not isinstance(data, Mapping):
        raise ConfigError("CONTEXTMODE_PRICES must be a JSON object of model families")
    return tuple(_price(str(family), spec) for family, spec in data.items())


def _read(path: str) -> str:
    try:
        return Path(path).expanduser().read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"CONTEXTMODE_PRICES: cannot read {path}: {exc.strerror}") from None
