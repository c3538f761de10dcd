"""Tolerant JSON parsing of model output, validated into plain dataclasses.

Models asked for "only a JSON object" still wrap it in code fences, put prose
around it, leave trailing commas, use single or full-width quotes, write Python
literals, or stop half-way; the repair is the maintained
`json_repair` library's, not ours. Auxiliary processors must never
fail a turn because of that, so nothing here raises on bad input:
`extract_json` returns ``None`` and `parse_json_as` returns ``None`` after
logging a warning with a short excerpt of the text.

Validation is a small dataclass validator rather than a dependency: a field
typed ``float`` accepts ``"0.8"``, a field typed ``list[X]`` drops the items
that are not an ``X`` (and wraps a lone ``X``), unknown keys are ignored, and a
missing field falls back to its default.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import json_repair

__all__ = ["SchemaError", "extract_json", "parse_json_as", "validate_as"]

logger = logging.getLogger("contextmode.jsonparse")

T = TypeVar("T")

_FENCE = re.compile(r"```[ \t]*(?:json5?|JSON|javascript|js|python)?[ \t]*\n?(.*?)(?:```|\Z)", re.S)
_EXCERPT_CHARS = 200


class SchemaError(ValueError):
    """Parsed JSON does not fit the requested dataclass (internal; never escapes `parse_json_as`)."""


def _excerpt(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= _EXCERPT_CHARS else flat[:_EXCERPT_CHARS] + "…"


def extract_json(text: str | None) -> Any | None:
    """The first JSON object or array found in ``text``, repaired if need be; ``None`` if none.

    Repair is `json_repair`'s (fences, prose around the JSON, trailing commas,
    single or full-width quotes, Python literals, comments, truncation). When
    the text holds several JSON values outside one top-level array, the first
    object wins.
    """
    if not text or not text.strip():
        return None
    try:
        value = json_repair.loads(text)
    except Exception:  # the library's contract is "never raise", but bad input must not escape here
        value = None
    if isinstance(value, list) and not _starts_with_array(text):
        # Several values were found in prose: prefer the first object.
        value = next((v for v in value if isinstance(v, dict)), value[0] if value else None)
    if isinstance(value, dict | list) and (value or _looks_empty(text)):
        return value
    logger.warning("no JSON found in model output: %r", _excerpt(text))
    return None


def _starts_with_array(text: str) -> bool:
    fenced = _FENCE.search(text)
    body = (fenced.group(1) if fenced else text).strip()
    return body.startswith("[")


def _looks_empty(text: str) -> bool:
    """True when the text really holds ``{}`` or ``[]`` (not an empty repair of prose)."""
    return bool(re.search(r"\{\s*\}|\[\s*\]", text))


def parse_json_as(text: str | None, schema: type[T]) -> T | None:
    """Extract JSON from ``text`` and validate it into the dataclass ``schema``; ``None`` on failure."""
    data = extract_json(text)
    if data is None:
        return None
    try:
        return validate_as(data, schema)
    except SchemaError as exc:
        logger.warning("model JSON does not fit %s (%s): %r", schema.__name__, exc, _excerpt(text or ""))
        return None


def validate_as(data: Any, schema: type[T]) -> T:
    """Coerce ``data`` into ``schema`` (a dataclass or a type expression); raise `SchemaError`."""
    return typing.cast(T, _coerce(data, schema, schema.__name__ if hasattr(schema, "__name__") else "value"))


def _coerce(value: Any, tp: Any, where: str) -> Any:
    if tp is Any or tp is object:
        return value
    origin = get_origin(tp)
    if origin is Union or origin is types.UnionType:
        return _coerce_union(value, get_args(tp), where)
    if origin is Literal:
        return _coerce_literal(value, get_args(tp), where)
    if origin in (list, tuple, Sequence, set, frozenset) or tp in (list, tuple):
        return _coerce_sequence(value, tp, origin or tp, where)
    if origin in (dict, Mapping) or tp is dict:
        args = get_args(tp) or (str, Any)
        if not isinstance(value, dict):
            raise SchemaError(f"{where}: expected an object")
        return {str(k): _coerce(v, args[1], f"{where}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _coerce_dataclass(value, tp, where)
    return _coerce_scalar(value, tp, where)


def _coerce_union(value: Any, args: tuple[Any, ...], where: str) -> Any:
    if value is None and type(None) in args:
        return None
    errors = []
    for arg in args:
        if arg is type(None):
            continue
        try:
            return _coerce(value, arg, where)
        except SchemaError as exc:
            errors.append(str(exc))
    raise SchemaError("; ".join(errors) or f"{where}: null not allowed")


def _coerce_literal(value: Any, choices: tuple[Any, ...], where: str) -> Any:
    for choice in choices:
        if value == choice or (isinstance(value, str) and isinstance(choice, str) and value.strip().lower() == choice):
            return choice
    raise SchemaError(f"{where}: {value!r} is not one of {list(choices)}")


def _coerce_sequence(value: Any, tp: Any, origin: Any, where: str) -> Any:
    args = get_args(tp)
    item_tp = args[0] if args else Any
    if not isinstance(value, list | tuple):
        value = [] if value is None else [value]
    items = []
    for index, item in enumerate(value):
        try:
            items.append(_coerce(item, item_tp, f"{where}[{index}]"))
        except SchemaError as exc:  # one bad item must not sink the others
            logger.info("dropping invalid item: %s", exc)
    return tuple(items) if origin in (tuple, Sequence) else list(items)


def _coerce_dataclass(value: Any, cls: type, where: str) -> Any:
    if not isinstance(value, dict):
        raise SchemaError(f"{where}: expected an object, got {type(value).__name__}")
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.name in value:
            kwargs[f.name] = _coerce(value[f.name], hints[f.name], f"{where}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise SchemaError(f"{where}: missing field {f.name!r}")
    return cls(**kwargs)


_TRUE = {"true", "yes", "y", "1", "是", "对", "需要"}
_FALSE = {"false", "no", "n", "0", "否", "不", "不需要", ""}


def _coerce_scalar(value: Any, tp: Any, where: str) -> Any:
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, int | float):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
    elif tp is int or tp is float:
        if isinstance(value, bool):
            raise SchemaError(f"{where}: expected a number, got a boolean")
        if isinstance(value, int | float):
            return tp(value)
        if isinstance(value, str):
            try:
                number = float(value.strip().rstrip("%"))
            except ValueError:
                pass
            else:
                return tp(number)
    elif tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
    elif isinstance(tp, type) and isinstance(value, tp):
        return value
    raise SchemaError(f"{where}: expected {getattr(tp, '__name__', tp)}, got {type(value).__name__}")
