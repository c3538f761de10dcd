"""Fixtures shared by the model tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from contextmode.testing.stub_server import StubServer


@pytest.fixture
def server() -> Iterator[StubServer]:
    """The project's OpenAI-compatible stub server, answering in 3-character chunks."""
    stub = StubServer(chunk_chars=3)
    stub.start()
    yield stub
    stub.stop()
