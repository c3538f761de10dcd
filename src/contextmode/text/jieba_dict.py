"""jieba's prefix dictionary, loaded a first character at a time.

jieba keeps every dictionary word and each of its prefixes in one dict (about 500,000
entries); building it from ``dict.txt`` takes a cold process a second or more, and even
jieba's own cache (one marshal of the whole dict) costs 0.3-0.7 s to read back. A
context rarely needs more than a few hundred of its 11,772 first characters.

`BucketedTokenizer` is a ``jieba.Tokenizer`` whose ``FREQ`` starts empty and takes in the
entries of a first character the first time a text holding that character is cut. Every
lookup jieba makes is of a substring of the text it cuts (the word graph, the route, the
HMM fallback, search-mode grams, the POS tagger's graph), so the entries it asks for are
always already in: cuts are the same as jieba's (tests/text/test_jieba_dict.py compares
them). The buckets come from a file under ``CONTEXTMODE_HOME/cache``, written once from
jieba's ``dict.txt`` (keyed by its path, size and modification time); a cache that cannot
be written or read is ignored and the whole dictionary is built in memory, as jieba does.
"""

from __future__ import annotations

import contextlib
import hashlib
import marshal
import mmap
import os
import struct
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path

import jieba

__all__ = ["BucketedTokenizer", "bucket_file"]

_FORMAT = 1
_HEADER = struct.Struct("<Q")
"""The file: the index's length, the index (marshal of ``(format, total, {char: (offset,
length)})``), then one marshalled ``{word or prefix: frequency}`` per first character."""


def _dict_path() -> Path:
    name: str = jieba.DEFAULT_DICT_NAME
    return Path(jieba.__file__).parent / name


def bucket_file(dict_path: Path | None = None) -> Path:
    """Where the buckets of ``dict_path`` (default: jieba's ``dict.txt``) are cached."""
    from ..settings import contextmode_home

    path = dict_path or _dict_path()
    stat = path.stat()
    key = hashlib.sha256(f"{_FORMAT}|{path}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:24]
    return contextmode_home() / "cache" / f"jieba-{key}.buckets"


def _write_buckets(freq: dict[str, int], total: int, out: Path) -> None:
    """``freq`` grouped by first character, written whole and renamed into place."""
    groups: dict[str, dict[str, int]] = {}
    for word, n in freq.items():
        groups.setdefault(word[0], {})[word] = n
    blobs: list[bytes] = []
    index: dict[str, tuple[int, int]] = {}
    offset = 0
    for char, bucket in groups.items():
        blob = marshal.dumps(bucket)
        index[char] = (offset, len(blob))
        blobs.append(blob)
        offset += len(blob)
    head = marshal.dumps((_FORMAT, total, index))
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=".jieba-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_HEADER.pack(len(head)))
            f.write(head)
            for blob in blobs:
                f.write(blob)
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class _Buckets:
    """An open bucket file: the index in memory, the buckets read on demand."""

    def __init__(self, path: Path) -> None:
        with path.open("rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        (size,) = _HEADER.unpack_from(self._map, 0)
        start = _HEADER.size
        fmt, self.total, self.index = marshal.loads(self._map[start : start + size])
        if fmt != _FORMAT or not isinstance(self.index, dict) or not isinstance(self.total, int):
            raise ValueError(f"{path}: not a jieba bucket file of format {_FORMAT}")
        self._base = start + size

    def bucket(self, char: str) -> dict[str, int] | None:
        span = self.index.get(char)
        if span is None:
            return None
        offset, length = span
        start = self._base + offset
        found: dict[str, int] = marshal.loads(self._map[start : start + length])
        return found


def _open_buckets(tokenizer: jieba.Tokenizer) -> _Buckets | tuple[dict[str, int], int]:
    """The cached buckets, written first if missing; the whole dictionary when the cache
    folder cannot be written."""
    path = bucket_file()
    with contextlib.suppress(OSError, ValueError, EOFError, TypeError, struct.error):
        return _Buckets(path)
    freq, total = tokenizer.gen_pfdict(tokenizer.get_dict_file())
    with contextlib.suppress(OSError):
        _write_buckets(freq, total, path)
        return _Buckets(path)
    return freq, total  # pragma: no cover - an unwritable cache folder


class BucketedTokenizer(jieba.Tokenizer):  # type: ignore[misc]  # jieba ships no types
    """A ``jieba.Tokenizer`` of the default dictionary that reads its prefix dictionary a
    first character at a time (see the module docstring)."""

    FREQ: dict[str, int]
    total: int
    initialized: bool

    def __init__(self) -> None:
        super().__init__()
        self._buckets: _Buckets | None = None
        self._seen: set[str] = set()
        self._load_lock = threading.Lock()

    def initialize(self, dictionary: str | None = None) -> None:
        if dictionary is not None:
            raise ValueError("BucketedTokenizer reads jieba's default dictionary only")
        with self.lock:
            if self.initialized:
                return
            opened = _open_buckets(self)
            if isinstance(opened, _Buckets):
                self._buckets = opened
                self.FREQ, self.total = {}, opened.total
            else:  # no cache: the whole dictionary, as jieba builds it
                self.FREQ, self.total = opened
            self.initialized = True

    def load_chars(self, chars: Iterable[str]) -> None:
        """Take in the dictionary entries starting with each of ``chars`` not yet taken in."""
        self.check_initialized()
        buckets = self._buckets
        if buckets is None:
            return
        missing = set(chars) - self._seen
        if not missing:
            return
        with self._load_lock:
            for char in missing - self._seen:
                bucket = buckets.bucket(char)
                if bucket:
                    # Entries added by add_word since are kept (their first character's
                    # bucket was taken in before they were added, so none is here).
                    self.FREQ.update(bucket)
                self._seen.add(char)

    def get_DAG(self, sentence: str) -> dict[int, list[int]]:
        self.load_chars(sentence)
        dag: dict[int, list[int]] = super().get_DAG(sentence)
        return dag

    def add_word(self, word: str, freq: int | None = None, tag: str | None = None) -> None:
        self.load_chars(word[:1])
        super().add_word(word, freq, tag)
