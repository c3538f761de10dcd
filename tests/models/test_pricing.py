"""The price table and the cache arithmetic: money per request, the usage fields each server
reports, the shared prefix of two requests, a bad ``CONTEXTMODE_PRICES`` named in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contextmode.errors import ConfigError
from contextmode.models.caching import (
    cacheable_prefix_tokens,
    request_text,
    session_cache_key,
    shared_prefix_chars,
    usage_from,
)
from contextmode.pricing import DEFAULT_PRICES, Price, load_prices, price_for, turn_cost
from contextmode.settings import EngineSettings
from contextmode.testing import CharTokenCounter
from contextmode.types import ChatMessage


def test_money_counts_cached_tokens_at_the_cache_price_above_the_minimum() -> None:
    price = Price(family="x", input=2.0, output=8.0, cache_read=0.1, cache_write=1.25, min_prefix=1024)
    cold = turn_cost(price, prompt_tokens=10_000, cached_tokens=0, completion_tokens=100)
    warm = turn_cost(price, prompt_tokens=10_000, cached_tokens=8_000, completion_tokens=100)
    assert cold.usd == pytest.approx((10_000 * 1.25 * 2.0 + 100 * 8.0) / 1e6)
    assert warm.usd == pytest.approx((8_000 * 0.1 * 2.0 + 2_000 * 1.25 * 2.0 + 100 * 8.0) / 1e6)
    # Below the vendor's minimum nothing is cached.
    assert turn_cost(price, prompt_tokens=900, cached_tokens=800).cached_tokens == 0


def test_models_find_their_family_by_name() -> None:
    assert price_for("gpt-5-mini").family == "openai"  # type: ignore[union-attr]
    assert price_for("claude-sonnet-4-5").family == "anthropic"  # type: ignore[union-attr]
    assert price_for("Qwen/qwen-plus").family == "qwen"  # type: ignore[union-attr]
    assert price_for("deepseek-chat").family == "deepseek"  # type: ignore[union-attr]
    assert price_for("smollm2") is None


def test_the_table_is_configurable_and_a_bad_one_is_named(tmp_path: Path) -> None:
    table = {"local": {"match": ["smollm"], "input": 0.01, "cache_read": 0.0}}
    path = tmp_path / "prices.json"
    path.write_text(json.dumps(table))
    for value in (json.dumps(table), str(path)):
        prices = load_prices(value)
        assert price_for("smollm2", prices) == Price(family="local", match=("smollm",), input=0.01, output=0.0,
                                                     cache_read=0.0)
    assert EngineSettings.from_env({"CONTEXTMODE_PRICES": str(path)}).prices == load_prices(str(path))
    assert EngineSettings.from_env({}).prices == DEFAULT_PRICES
    for bad, words in (("{", "not valid JSON"), ('{"x": {"output": 1}}', "needs an input price"),
                       ('{"x": {"input": 1, "inptu": 2}}', "unknown fields"), ("/no/such/file", "cannot read"),
                       ('{"x": {"input": "cheap"}}', "'x'")):
        with pytest.raises(ConfigError, match=words):
            load_prices(bad)


def test_each_servers_cached_count_is_read() -> None:
    openai = usage_from({"prompt_tokens": 100, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 64}})
    deepseek = usage_from({"prompt_tokens": 100, "prompt_cache_hit_tokens": 80, "prompt_cache_miss_tokens": 20})
    llamacpp = usage_from({"prompt_tokens": 100}, {"cache_n": 90, "prompt_n": 10})
    silent = usage_from({"prompt_tokens": 100, "completion_tokens": 5})
    assert [u.cached_tokens for u in (openai, deepseek, llamacpp, silent)] == [64, 80, 90, None]  # type: ignore[union-attr]
    assert usage_from(None) is None and usage_from({"completion_tokens": 3}) is None


def test_the_cacheable_prefix_is_what_two_requests_share_byte_for_byte() -> None:
    counter = CharTokenCounter()
    one = [ChatMessage(role="system", content="rules"), ChatMessage(role="user", content="hello")]
    two = [*one, ChatMessage(role="assistant", content="hi"), ChatMessage(role="user", content="more")]
    first, second = request_text(one), request_text(two)
    assert second.startswith(first) and shared_prefix_chars(first, second) == len(first)
    assert 0 < cacheable_prefix_tokens(first, second, counter) < counter.count(second)
    assert cacheable_prefix_tokens(None, second, counter) == 0
    changed = request_text([ChatMessage(role="system", content="Rules"), *two[1:]])
    assert cacheable_prefix_tokens(first, changed, counter) < counter.count("<|im_start|>system\n")
    assert shared_prefix_chars("abc", "abd") == 2 and shared_prefix_chars("", "x") == 0


def test_the_cache_key_names_no_id() -> None:
    key = session_cache_key("acme", "user-42")
    assert len(key) == 32 and "acme" not in key and "42" not in key
    assert key != session_cache_key("acme", "user-43") and key == session_cache_key("acme", "user-42")
