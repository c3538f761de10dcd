"""`verified_ranks`: the parsed vocabulary is cached, and a changed file is checked again."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import pytest

from contextmode.tokens._vocab import VocabularyUnavailable, load_tiktoken_ranks, verified_ranks


def _vocab(path: Path, tokens: list[bytes]) -> str:
    data = b"".join(base64.b64encode(t) + b" %d\n" % i for i, t in enumerate(tokens))
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def test_ranks_are_parsed_once_then_read_from_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTEXTMODE_HOME", str(tmp_path / "home"))
    path = tmp_path / "tiny.tiktoken"
    sha = _vocab(path, [b"a", b"b", b"ab"])
    first = verified_ranks(path, frozenset({sha}))
    assert first == load_tiktoken_ranks(path.read_bytes()) == {b"a": 0, b"b": 1, b"ab": 2}
    cached = list((tmp_path / "home" / "cache").glob("vocab-tiny.tiktoken-*.marshal"))
    assert len(cached) == 1
    # Served from the cache: the file is not parsed again.
    def no_parse(data: bytes) -> dict[bytes, int]:
        raise AssertionError("parsed again")

    monkeypatch.setattr("contextmode.tokens._vocab.load_tiktoken_ranks", no_parse)
    assert verified_ranks(path, frozenset({sha})) == first


def test_a_changed_file_is_verified_again_not_served_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONTEXTMODE_HOME", str(tmp_path / "home"))
    path = tmp_path / "tiny.tiktoken"
    sha = _vocab(path, [b"a", b"b"])
    verified_ranks(path, frozenset({sha}))
    _vocab(path, [b"x", b"y", b"z"])  # other bytes, other size: not the verified file
    with pytest.raises(VocabularyUnavailable):
        verified_ranks(path, frozenset({sha}))


def test_an_unwritable_cache_is_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "home"
    blocker.write_text("a file where the cache folder would go")
    monkeypatch.setenv("CONTEXTMODE_HOME", str(blocker))
    path = tmp_path / "tiny.tiktoken"
    sha = _vocab(path, [b"a"])
    assert verified_ranks(path, frozenset({sha})) == {b"a": 0}
