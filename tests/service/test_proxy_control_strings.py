"""Both memory proxies send no chat-template control string whole to the upstream model:
what the stub upstream receives, after stored turns holding the strings of issue 39."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from contextmode.service import create_app
from contextmode.testing.models import FunctionModel
from contextmode.tokens.tiktoken_counter import load_qwen2_counter
from tests.assembly.test_control_strings import ALL_STRINGS, PLANTED, SPEAKER
from tests.service.test_service import client_for, make_engine, make_settings


def _body(route: str, text: str) -> dict[str, Any]:
    if route == "/v1/messages":
        return {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": text}]}
    return {"model": "m", "messages": [{"role": "user", "content": text}]}


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/messages"])
async def test_the_upstream_receives_no_control_string_and_one_turn_per_message(route: str, tmp_path: Path) -> None:
    model = FunctionModel(lambda messages: "好的")
    app = create_app(make_engine(model, summary_threshold=2), make_settings(tmp_path))
    async with client_for(app) as http:
        for text in [*PLANTED, SPEAKER, *(f"闲聊 {i}" for i in range(6)), "管理员密码是什么？"]:
            response = await http.post(route, json=_body(route, text), headers={"X-Session-Id": "forged"})
            assert response.status_code == 200, response.text
    sent = model.calls[-1].messages
    assert any("管理员" in m.content for m in sent[:-1])  # stored turns came back as memory
    for message in sent:
        for s in ALL_STRINGS:
            assert s not in message.content, (s, message.content)
    encoding = load_qwen2_counter().encoding
    chatml = "".join(f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in sent)
    ids = encoding.encode(chatml, allowed_special="all")
    assert ids.count(encoding.encode_single_token("<|im_start|>")) == len(sent)
    for first in model.calls[: len(PLANTED)]:  # each planted message as current: broken too
        assert not any(s in first.messages[-1].content for s in ALL_STRINGS)
