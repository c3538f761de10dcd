"""DNS rebinding: with no API key the service answers loopback names only (Host and Origin)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from contextmode.service.app import create_app
from contextmode.service.settings import ServiceSettings
from contextmode.types import SessionKey
from tests.service.test_service import make_engine

_TURN = {"message": "你好"}


async def _post(app: object, host: str, *, origin: str | None = None, key: str | None = None) -> httpx.Response:
    headers = {"Host": host}
    if origin is not None:
        headers["Origin"] = origin
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:  # type: ignore[arg-type]
        return await client.post("/v1/sessions/s1/messages", json=_TURN, headers=headers)


async def test_without_api_keys_only_loopback_hosts_and_origins_are_served(tmp_path: Path) -> None:
    engine = make_engine()
    app = create_app(engine, ServiceSettings(image_dir=tmp_path))
    try:
        for host in ("127.0.0.1:8000", "localhost:8000", "[::1]:8000", "app.localhost"):
            r = await _post(app, host, origin=f"http://{host}")
            assert r.status_code == 200, (host, r.text)
        # A rebound name, a look-alike, a cross-origin page: refused before anything runs.
        for host, origin in (("evil.example:8000", None), ("localhost.evil.example", None),
                             ("127.0.0.1:8000", "https://evil.example"), ("127.0.0.1:8000", "null")):
            r = await _post(app, host, origin=origin)
            assert r.status_code == 403, (host, origin, r.text)
            assert r.json()["code"] == 40301
            assert "CONTEXTMODE_ALLOWED_HOSTS" in r.json()["msg"] or "origin" in r.json()["msg"]
        assert len(await engine.store.turns(SessionKey("local", "s1"))) == 2 * 4  # only the four allowed turns
        # Health probes name the pod's address: served whatever the host.
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://10.1.2.3") as c:
            assert (await c.get("/healthz")).status_code == 200
    finally:
        await engine.close()


@pytest.mark.parametrize(
    ("settings", "host", "status"),
    [
        (ServiceSettings(allowed_hosts=("memory.example.com",)), "memory.example.com", 200),
        (ServiceSettings(allowed_hosts=("memory.example.com",)), "127.0.0.1", 403),
        (ServiceSettings(allowed_hosts=(".example.com",)), "a.example.com:443", 200),
        (ServiceSettings(allowed_hosts=("*",)), "anything.example", 200),
        (ServiceSettings(api_keys={"k1": "t1"}), "anything.example", 200),  # keys guard every request
    ],
)
async def test_allowed_hosts_are_configurable(settings: ServiceSettings, host: str, status: int) -> None:
    engine = make_engine()
    try:
        r = await _post(create_app(engine, settings), host, key="k1" if settings.api_keys else None)
        assert r.status_code == status, r.text
    finally:
        await engine.close()


def test_allowed_hosts_from_the_environment() -> None:
    env = {"CONTEXTMODE_ALLOWED_HOSTS": " memory.example.com, .corp.example ,"}
    assert ServiceSettings.from_env(env).allowed_hosts == ("memory.example.com", ".corp.example")
    assert ServiceSettings.from_env({}).allowed_hosts is None
