"""Tolerant JSON parsing of model output (seed 003 §4.4)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import pytest

from contextmode.jsonparse import SchemaError, extract_json, parse_json_as, validate_as


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a": 1}', {"a": 1}),
        ('```json\n{"a": 1}\n```', {"a": 1}),
        ("```\n[1, 2]\n```", [1, 2]),
        ('好的，结果如下：\n{"key": "spice", "value": "不要辣"}\n希望有帮助！', {"key": "spice", "value": "不要辣"}),
        ('Sure! Here it is: {"a": [1, 2,], "b": {"c": 3,},} Let me know.', {"a": [1, 2], "b": {"c": 3}}),
        ("{'a': 'it\\'s', 'b': True, 'c': None}", {"a": "it's", "b": True, "c": None}),
        ('{intensity: 0.8, emotion: "悲伤"}', {"intensity": 0.8, "emotion": "悲伤"}),
        ("{“key”：“预算”，“n”：3}", {"key": "预算", "n": 3}),
        ('{"q": "他说“你好”，然后走了"}', {"q": "他说“你好”，然后走了"}),
        ('{"a": 1, // why\n "url": "http://x.y/z#frag"}', {"a": 1, "url": "http://x.y/z#frag"}),
        ('{"a": 1, /* note */ "b": 2}', {"a": 1, "b": 2}),
        ('{"text": "line one\nline two"}', {"text": "line one\nline two"}),
        ('{"a": [1, 2, {"b": "trunc', {"a": [1, 2, {"b": "trunc"}]}),
        ('{"a": 1, "b": ', {"a": 1, "b": ""}),
        ('```json\n{"a": 1,\n', {"a": 1}),
        ("prose [not json] then {\"ok\": true}", {"ok": True}),
    ],
)
def test_extract_json_repairs_what_models_produce(text: str, expected: object) -> None:
    assert extract_json(text) == expected


@pytest.mark.parametrize("text", [None, "", "   ", "no json here", "yes", "{", "{{{{"])
def test_extract_json_returns_none_instead_of_raising(text: str | None) -> None:
    assert extract_json(text) in (None, {})


def test_failure_is_logged_with_an_excerpt(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="contextmode.jsonparse"):
        assert extract_json("the model rambled " * 50) is None
    assert "no JSON found" in caplog.text
    assert len(caplog.records[0].getMessage()) < 400


@dataclass(frozen=True, kw_only=True)
class Item:
    key: str
    value: str
    kind: Literal["preference", "constraint"] = "constraint"


@dataclass(frozen=True, kw_only=True)
class Payload:
    items: list[Item] = field(default_factory=list)
    tags: Sequence[str] = ()
    score: float = 0.0
    ok: bool = False
    note: str | None = None


def test_parse_json_as_validates_and_coerces() -> None:
    text = """```json
    {"items": [{"key": "spice", "value": "不要辣", "kind": "Preference"},
               {"key": "budget"},
               "junk",
               {"key": "n", "value": 50}],
     "tags": "single", "score": "0.75", "ok": "yes", "extra": 1}
    ```"""
    payload = parse_json_as(text, Payload)
    assert payload == Payload(
        items=[Item(key="spice", value="不要辣", kind="preference"), Item(key="n", value="50")],
        tags=("single",),
        score=0.75,
        ok=True,
    )


def test_parse_json_as_returns_none_on_a_shape_mismatch(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="contextmode.jsonparse"):
        assert parse_json_as('{"key": "k"}', Item) is None
        assert parse_json_as('["a list"]', Item) is None
        assert parse_json_as("nothing", Item) is None
    assert "does not fit Item" in caplog.text


def test_validate_as_raises_schema_error_for_direct_callers() -> None:
    with pytest.raises(SchemaError):
        validate_as({"score": "high"}, Payload)
    with pytest.raises(SchemaError):
        validate_as({"ok": [1]}, Payload)
    assert validate_as({"note": None}, Payload).note is None
    assert validate_as("3", int) == 3
    with pytest.raises(SchemaError):
        validate_as(True, float)
