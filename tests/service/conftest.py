"""Fixtures of the proxy tests that use the stub server as the engine's model (over real HTTP):
``stub`` answers with the test module's ``reply`` function, ``engine`` is an engine whose model
is the project's `OpenAIChatModel` on it, ``proxy_app`` the service around that engine. A module
that defines its own ``stub`` or ``engine`` fixture uses its own."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from contextmode.engine import Engine
from contextmode.models.openai import OpenAIChatModel
from contextmode.service import create_app
from contextmode.testing.stub_server import StubServer
from tests.service.test_service import make_engine, make_settings


@pytest.fixture
def stub(request: pytest.FixtureRequest) -> Iterator[StubServer]:
    server = StubServer(getattr(request.module, "reply", None))
    with server:
        yield server


@pytest.fixture
async def engine(stub: StubServer) -> AsyncIterator[Engine]:
    # The model's own client retries too (max_retries=2): a relayed call must not stack on it.
    model = OpenAIChatModel(model="stub-model", base_url=stub.url, api_key="k", max_retries=2)
    engine = make_engine(model, context_window=4000)
    yield engine
    await engine.close()


@pytest.fixture
def proxy_app(engine: Engine, tmp_path: Path) -> Any:
    return create_app(engine, make_settings(tmp_path))
