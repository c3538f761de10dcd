"""`trace_to_dict` is `trace_to_json` decoded, without encoding and decoding: the same values,
fresh containers at every level (the packer rewrites them in place), JSON's own answer for
anything that is not a plain builtin."""

from __future__ import annotations

import enum
import json
from datetime import UTC, datetime

from contextmode.engine import TurnRequest
from contextmode.store.records import (
    PinUsed,
    RecalledTurn,
    TraceLayer,
    TraceRewrite,
    TurnTrace,
    TurnUsage,
    trace_to_dict,
    trace_to_json,
)
from contextmode.types import ChatMessage, ModelCall, SessionKey, ToolCall
from tests.service.test_service import make_engine


class _Level(enum.IntEnum):
    HIGH = 3


def _rich() -> TurnTrace:
    return TurnTrace(
        turn=4, user_seq=7, answer_seq=8, created_at=datetime(2026, 5, 2, 8, 30, 1, 123456, tzinfo=UTC),
        typed="那家店在哪？\u2028", sent="Where is the shop?", follow_up=None,
        messages=(
            ChatMessage(role="system", content="你是助手"),
            ChatMessage(role="assistant", content="", tool_calls=(ToolCall(id="c1", name="f", arguments='{"a": 1}'),)),
            ChatMessage(role="tool", content="{}", tool_call_id="c1"),
            ChatMessage(role="user", content="那家店在哪？"),
        ),
        layers=(TraceLayer(name="recent", allocated=100, used=20, items=2, dropped_seqs=(1, 3), truncated=True),),
        recalled=(RecalledTurn(seq=2, layer="recall", why="relevant", text="店在河边", score=0.5,
                               matched=("店", "河"), neighbour_of=None, ranker="bm25"),),
        pins=(PinUsed(key="budget", value="两千", source_seq=1),),
        rewrite=TraceRewrite(text="Where is the shop by the river?", changed=True, source="offline", decision="hint"),
        processors={"detector": "OfflineDetector 1.0"},
        usage=TurnUsage(prompt_tokens=120, cacheable_tokens=80, usd=1e-05, session_usd=float("inf")),
        model_calls=(ModelCall(step="reply", priority="reply", session="", start_ms=0.0, wait_ms=0.1,
                               duration_ms=2.5, prompt_tokens=None, completion_tokens=4, outcome="ok"),),
        detection_score=-0.0, ttft_ms=1.5, pii_masked={"phone": 1},
    )


def test_a_rich_trace_is_its_json_decoded_in_fresh_containers() -> None:
    trace = _rich()
    data = trace_to_dict(trace)
    assert data == json.loads(trace_to_json(trace))
    assert json.dumps(data, ensure_ascii=False, separators=(",", ":")) == trace_to_json(trace)
    data["recalled"][0]["text"] = "changed"
    data["layers"][0]["dropped_seqs"].append(9)
    data["processors"]["x"] = "y"
    assert trace.recalled[0].text == "店在河边" and tuple(trace.layers[0].dropped_seqs) == (1, 3)
    assert "x" not in trace.processors


def test_a_value_json_would_change_goes_through_json() -> None:
    trace = _rich()
    odd = TurnTrace(**{**vars(trace), "turn": _Level.HIGH, "processors": {1: "int key"}})
    data = trace_to_dict(odd)
    assert data == json.loads(trace_to_json(odd))
    assert type(data["turn"]) is int and data["processors"] == {"1": "int key"}


async def test_the_traces_of_a_conversation_are_their_json_decoded() -> None:
    engine = make_engine(context_window=600)
    key = SessionKey("t", "s")
    said = ["I love spicy food and my budget is 2000.", "Suggest a dinner place", "Where is it?",
            "我五月要去成都，不吃辣。", "那边有什么好吃的？", "Tell me more about the first one"]
    try:
        for text in said:
            await engine.turn(TurnRequest(key=key, message=text))
        await engine.drain()
        traces = [await engine.trace(SessionKey("t", "s"), n) for n in range(1, len(said) + 1)]
    finally:
        await engine.close()
    for trace in traces:
        assert trace_to_dict(trace) == json.loads(trace_to_json(trace))
