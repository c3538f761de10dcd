"""`BucketedTokenizer`: jieba's prefix dictionary read a first character at a time cuts
exactly as jieba does, from a cache written once, and reads only what a text needs."""

from __future__ import annotations

import random
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

jieba = pytest.importorskip("jieba")
jieba.setLogLevel(60)

from jieba.posseg import POSTokenizer  # noqa: E402

from contextmode.text.jieba_dict import BucketedTokenizer, bucket_file  # noqa: E402

TEXTS = [
    "我不吃辣，预算五十以内",
    "预算改成一百元，周末也开吗？",
    "帮我总结一下这周的计划：周一健身，周三读书。",
    "冯提莫唱歌很好听，他来到了网易杭研大厦",
    "小明硕士毕业于中国科学院计算所，后在日本京都大学深造",
    "I live in Boston 我住在波士顿, budget $20 per meal; iPhone 15 Pro 和 T恤",
    "工信处女干事每月经过下属科室都要亲口交代24口交换机等技术性器件的安装工作",
    "结婚的和尚未结婚的都应该参加，长春市长春节讲话",
    "  \r\n\t 空白 与\n换行  ",
    "𠀀𠀁 罕见字、emoji 😀 与 ㊣ 符号",
    "",
    "AT&T 和 C++ 以及 3.14 与 50%-60% 的 A-B 测试",
]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("jieba-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CONTEXTMODE_HOME", str(path))
        yield path


@lru_cache(maxsize=1)
def reference() -> Any:
    """jieba's own tokenizer with the whole dictionary."""
    tokenizer = jieba.Tokenizer()
    tokenizer.initialize()
    return tokenizer


def cuts(tokenizer: Any, text: str) -> dict[str, list[Any]]:
    tagger = object.__new__(POSTokenizer)
    tagger.tokenizer = tokenizer
    tagger.word_tag_tab = jieba.posseg.dt.word_tag_tab
    return {
        "hmm": tokenizer.lcut(text),
        "no_hmm": tokenizer.lcut(text, HMM=False),
        "all": tokenizer.lcut(text, cut_all=True),
        "search": tokenizer.lcut_for_search(text),
        "tokenize": list(tokenizer.tokenize(text)),
        "pos": [tuple(p) for p in tagger.lcut(text)],
    }


def test_cuts_are_jiebas_from_a_cold_start(home: Path) -> None:
    fresh = BucketedTokenizer()
    for text in TEXTS:
        assert cuts(fresh, text) == cuts(reference(), text), text
    assert fresh.total == reference().total


@lru_cache(maxsize=1)
def dictionary_words() -> list[str]:
    path = Path(jieba.__file__).parent / "dict.txt"
    return [line.split(" ", 1)[0] for line in path.read_text(encoding="utf-8").splitlines()]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 12), noise=st.text(max_size=6))
def test_cuts_are_jiebas_on_runs_of_dictionary_words(home: Path, seed: int, n: int, noise: str) -> None:
    # Runs of dictionary words glued together: every kind of ambiguity the word graph meets.
    # A new tokenizer each time, so each example starts with nothing taken in.
    rng = random.Random(seed)
    text = "".join(rng.choice(dictionary_words()) for _ in range(n)) + noise
    assert cuts(BucketedTokenizer(), text) == cuts(reference(), text)


def test_the_cache_is_written_once_then_read(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    BucketedTokenizer().lcut("杭州")
    assert bucket_file().is_file() and bucket_file().parent == home / "cache"
    monkeypatch.setattr(BucketedTokenizer, "gen_pfdict", staticmethod(_no_build))
    assert BucketedTokenizer().lcut("西湖边的那家店") == reference().lcut("西湖边的那家店")


def test_a_text_takes_in_only_its_own_characters(home: Path) -> None:
    tokenizer = BucketedTokenizer()
    tokenizer.lcut("我不吃辣，预算五十以内")
    # The entries of the text's characters (common ones start thousands of words), not the
    # 500,000 of the whole dictionary.
    assert 0 < len(tokenizer.FREQ) < len(reference().FREQ) / 20
    assert {word[0] for word in tokenizer.FREQ} <= set("我不吃辣，预算五十以内")


def test_a_damaged_cache_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTEXTMODE_HOME", str(tmp_path))
    path = bucket_file()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not marshal at all")
    assert BucketedTokenizer().lcut("长春市长春节讲话") == reference().lcut("长春市长春节讲话")
    # Written again, whole: the next tokenizer reads it without building anything.
    monkeypatch.setattr(BucketedTokenizer, "gen_pfdict", staticmethod(_no_build))
    assert BucketedTokenizer().lcut("南京市长江大桥") == reference().lcut("南京市长江大桥")


def _no_build(f: Any) -> Any:
    raise AssertionError("built the dictionary again")


def test_added_words_are_kept_and_cut_as_jieba_cuts_them(home: Path) -> None:
    ours, theirs = BucketedTokenizer(), jieba.Tokenizer()
    for tokenizer in (ours, theirs):
        tokenizer.add_word("杭研大厦", 50)
        tokenizer.add_word("预算改", 3)
        tokenizer.del_word("周末")
    for text in ("他来到了网易杭研大厦", "预算改成一百元，周末也开吗？"):
        assert cuts(ours, text) == cuts(theirs, text)
    assert ours.total == theirs.total
