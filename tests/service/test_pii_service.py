"""The service with ``pii="mask"``: what a turn stores through either route — the turns, the
trace, the response kept for an ``Idempotency-Key`` retry — holds none of the planted values
(a byte scan of the SQLite database and its WAL), while the model got the message as typed."""

from __future__ import annotations

from pathlib import Path

from contextmode.service import create_app
from contextmode.store import open_store
from contextmode.testing.models import FunctionModel
from tests.engine.test_pii_policy import MESSAGES, PLANTED
from tests.service.test_service import client_for, make_engine, make_settings


async def test_a_masked_tenant_stores_no_planted_value_through_the_service(tmp_path: Path) -> None:
    model = FunctionModel(lambda messages: f"记下了：{messages[-1].content}")
    store = open_store(f"sqlite:///{tmp_path}/svc.db")
    engine = make_engine(model, store=store, pii="mask")
    app = create_app(engine, make_settings(tmp_path))
    async with client_for(app) as http:
        for i, text in enumerate(MESSAGES[:3]):
            response = await http.post("/v1/sessions/s1/messages", json={"message": text},
                                       headers={"Idempotency-Key": f"k-{i}"})
            assert response.status_code == 200, response.text
            assert text in response.text or "记下了" in response.text
            replay = await http.post("/v1/sessions/s1/messages", json={"message": text},
                                     headers={"Idempotency-Key": f"k-{i}"})
            assert replay.headers.get("idempotent-replayed") == "true"
            proxied = await http.post("/v1/chat/completions", headers={"X-Session-Id": "s2", "Idempotency-Key": f"p-{i}"},
                                      json={"model": "m", "messages": [{"role": "user", "content": text}]})
            assert proxied.status_code == 200, proxied.text
    assert [c.messages[-1].content for c in model.calls[::2]] == list(MESSAGES[:3])  # as typed
    await engine.drain()
    data = b"".join(f.read_bytes() for f in sorted(tmp_path.glob("svc.db*")))
    assert b"138****5678" in data
    for value in PLANTED:
        assert value.encode() not in data, value
    await engine.close()
