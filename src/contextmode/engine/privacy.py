"""The personal-data policy at the one place where turns and traces are written.

With ``EngineSettings(pii="mask")`` every turn is masked (`contextmode.text.pii`) just
before the store gets it: its text, its metadata (a rewrite, a rejected rewrite) and its
tool calls' arguments. Everything made later from the log (pins, the summary, key
moments, the recall index, exports) is made from the masked text, and the exchange's
trace is masked the same way before it is kept. The current message still reaches the
model as typed: masking happens after preparing. A masked turn says how many values of
each kind it lost in ``metadata["pii_masked"]`` (``{"phone": 1}``). With ``keep`` (the
default) nothing here changes anything.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..settings import PiiPolicy
from ..store.records import TurnTrace, trace_from_json, trace_to_dict
from ..text.pii import JsonValue, PiiKind, mask_json, mask_pii
from ..tokens.base import TokenCounter
from ..types import NewTurn, Turn

__all__ = ["PII_COUNT_KEY", "keepable", "keepable_trace", "masked_counts"]

PII_COUNT_KEY = "pii_masked"
"""Metadata key of a masked turn: how many values of each kind were masked."""

_AGENT_KEYS = frozenset({"tool_calls", "tool_call_id", "tool_name"})


def _masked_calls(calls: object, counts: Counter[PiiKind]) -> object:
    """Tool calls with their arguments masked as JSON (they stay valid JSON)."""
    if not isinstance(calls, list):
        return calls
    out: list[object] = []
    for call in calls:
        if isinstance(call, dict) and isinstance(call.get("arguments"), str):
            try:
                args: JsonValue = json.loads(call["arguments"])
            except ValueError:
                masked_text = mask_pii(call["arguments"])
                counts.update(masked_text.counts)
                call = {**call, "arguments": masked_text.text}
            else:
                call = {**call, "arguments": json.dumps(mask_json(args, counts), ensure_ascii=False)}
        out.append(call)
    return out


def _masked_metadata(metadata: Mapping[str, Any], counts: Counter[PiiKind]) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    for key, value in metadata.items():
        if key == "tool_calls":
            meta[key] = _masked_calls(value, counts)
        elif key in _AGENT_KEYS:
            meta[key] = value
        else:
            meta[key] = mask_json(value, counts)
    return meta


def _masked_turn(turn: NewTurn, counter: TokenCounter) -> NewTurn:
    counts: Counter[PiiKind] = Counter()
    content = mask_pii(turn.content)
    counts.update(content.counts)
    meta = _masked_metadata(turn.metadata, counts)
    if not counts:
        return turn
    meta[PII_COUNT_KEY] = dict(counts)
    tokens = turn.tokens
    if content.text != turn.content:
        tokens = max(0, tokens - counter.count(turn.content) + counter.count(content.text))
    return replace(turn, content=content.text, tokens=tokens, metadata=meta)


def keepable(policy: PiiPolicy, counter: TokenCounter, turns: Sequence[NewTurn]) -> list[NewTurn]:
    """``turns`` as the store may keep them under ``policy``: as they are (``keep``), or with
    their personal data masked (``mask``; token counts adjusted to the masked text)."""
    if policy != "mask":
        return list(turns)
    return [_masked_turn(turn, counter) for turn in turns]


def keepable_trace(policy: PiiPolicy, trace: TurnTrace) -> TurnTrace:
    """``trace`` as the store may keep it under ``policy``: every text in it masked for ``mask``
    (what was typed, what was sent, the messages, the recalled turns, the rewrite)."""
    if policy != "mask":
        return trace
    # Its time is no text (its digits may look like personal data: "16.822740" lost a digit).
    masked = {k: v if k == "created_at" else mask_json(v) for k, v in trace_to_dict(trace).items()}
    # The stored turns it refers to are masked alike: keep what the texts may refer to.
    return replace(trace_from_json(json.dumps(masked, ensure_ascii=False)), sources=trace.sources)


def masked_counts(*turns: Turn | None) -> dict[str, int]:
    """How many values of each kind were masked in ``turns`` (an exchange's user turn and
    answer), from their ``pii_masked`` metadata; empty when none was."""
    total: Counter[str] = Counter()
    for turn in turns:
        counts = turn.metadata.get(PII_COUNT_KEY) if turn is not None else None
        if isinstance(counts, dict):
            total.update({str(k): int(v) for k, v in counts.items() if isinstance(v, int)})
    return dict(total)
