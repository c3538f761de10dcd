"""Property: no request the OpenAI proxy sends the model holds an assistant tool call without all
of its results (or a result without its call), whatever the window, the number of parallel calls,
the rounds before an answer, the size of the results, their order, and streamed or whole replies.

(Windows start at 1,200 tokens: below that, three parallel calls for three rounds do not fit
at all and the proxy refuses the step with a clear 400, "the current message needs N tokens".)

Each example runs an agent loop with the official openai SDK through the proxy against the stub
model (which calls tools like an agent), then checks every request the stub received with
OpenAI's pairing rules (`wire_pairing_errors`) and that it fits the window.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextmode.assembly.assemble import paired_turns
from contextmode.models.openai import OpenAIChatModel
from contextmode.service import create_app
from contextmode.testing.agents import wire_pairing_errors
from contextmode.testing.counters import CharTokenCounter
from contextmode.testing.stub_server import StubServer, tool_agent_reply
from contextmode.tokens import count_messages
from contextmode.types import ToolCall, tool_metadata
from tests.assembly.test_assembly import make_turn
from tests.service.test_agent_proxy import _chat_message, _completion
from tests.service.test_service import make_engine, make_settings


def test_an_agent_step_stays_one_block_when_answers_are_paired() -> None:
    # user 1, a call answering it (reply_to 1), its two results, then the answer (reply_to 1):
    # pairing answers with their question moved the call and the answer together, leaving the
    # results after the answer (a request every strict server refuses).
    calls = (ToolCall(id="call_1_a", name="search"), ToolCall(id="call_1_b", name="search"))
    turns = [
        make_turn(1, "find flights", role="user"),
        replace(make_turn(2, "", role="assistant"), metadata={"reply_to": 1, **tool_metadata(tool_calls=calls)}),
        replace(make_turn(3, "r a", role="tool"), metadata=tool_metadata(tool_call_id="call_1_a")),
        replace(make_turn(4, "r b", role="tool"), metadata=tool_metadata(tool_call_id="call_1_b")),
        replace(make_turn(5, "two flights", role="assistant"), metadata={"reply_to": 1}),
        make_turn(6, "and hotels?", role="user"),
    ]
    assert [t.seq for t in paired_turns(turns)] == [1, 2, 3, 4, 5, 6]
    assert [t.seq for t in paired_turns([turns[i] for i in (0, 5, 1, 2, 3, 4)])] == [1, 2, 3, 4, 5, 6]



def _result(name: str, arguments: str, big_lines: int) -> str:
    args = json.loads(arguments)
    if name == "read_file":
        return "\n".join(f"line {i}: entry about {args['query']} 第{i}行" for i in range(big_lines))
    return f"result {args['part']} for {args['query']}: 3 hits, 最便宜 {100 + args['part']} 元"


async def _loop(stub: StubServer, tmp_path: Path, window: int, reserve: int, big_lines: int, seed: int) -> None:
    rng = random.Random(seed)
    model = OpenAIChatModel(model="stub-model", base_url=stub.url, api_key="k", max_retries=0)
    engine = make_engine(model, context_window=window, reply_reserve=reserve)
    app = create_app(engine, make_settings(tmp_path))
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")
    sdk = openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", http_client=http, max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."},
                                      {"role": "user", "content": "Find flights to Lisbon."}]
    try:
        for iteration in range(12):
            text, calls = await _completion(sdk, messages, stream=rng.random() < 0.5)
            if calls:
                messages.append({"role": "assistant", "content": text or None, "tool_calls": calls})
                results = [{"role": "tool", "tool_call_id": c["id"],
                            "content": _result(c["function"]["name"], c["function"]["arguments"], big_lines)}
                           for c in calls]
                rng.shuffle(results)  # parallel results come back in any order
                messages.extend(results)
            else:
                messages.append({"role": "assistant", "content": text})
                messages.append({"role": "user", "content": f"下一个问题 {iteration}: 酒店呢?"})
    finally:
        await sdk.close()
        await engine.close()


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    window=st.integers(1200, 4096),
    reserve=st.integers(64, 400),
    parallel=st.integers(1, 4),
    rounds=st.integers(1, 3),
    big_lines=st.integers(5, 600),
    seed=st.integers(0, 10_000),
)
def test_no_request_holds_a_call_without_its_results(
    tmp_path_factory: pytest.TempPathFactory, window: int, reserve: int, parallel: int, rounds: int,
    big_lines: int, seed: int,
) -> None:
    stub = StubServer(tool_agent_reply(rounds=rounds, parallel=parallel))
    with stub:
        asyncio.run(_loop(stub, tmp_path_factory.mktemp("pairing"), window, reserve, big_lines, seed))
        received = stub.chat_requests
    assert len(received) == 12
    for request in received:
        assert wire_pairing_errors(request.messages) == [], request.messages
        assert count_messages(CharTokenCounter(), [_chat_message(m) for m in request.messages]) <= window - reserve
