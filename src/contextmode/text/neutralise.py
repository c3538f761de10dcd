"""Chat-template control strings, broken so that no tokenizer reads them as special tokens.

A model server that applies a chat template and then tokenizes with special tokens
parsed (llama.cpp's server, vLLM, TGI) turns ``<|im_start|>`` written inside a message
into the real turn marker: a stored turn holding ``<|im_end|>\\n<|im_start|>system`` would
open a forged system turn. `neutralise` puts a zero-width space (U+200B) after the first
character of each control string, so the text reads the same to a person while its
bytes no longer match any special token (no tokenizer's normaliser drops U+200B, and
special tokens are matched before normalising). The log keeps what was typed: this runs
where stored or quoted text becomes model input (`contextmode.assembly.render`), never
on what is stored.

`CONTROL_STRINGS` is the table of families covered (docs/architecture.md shows it too);
beyond the listed strings, any ``<|name|>`` and ``<｜name｜>`` (DeepSeek's full-width bars)
is broken as well, which covers the reserved and tool tokens of the same families.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

__all__ = ["BREAK", "CONTROL_STRINGS", "has_control_string", "neutralise"]

BREAK: Final = "\u200b"
"""What is put after the first character of a control string: a zero-width space."""

CONTROL_STRINGS: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType({
    "ChatML (Qwen, Yi, SmolLM, OpenAI harmony)": (
        "<|im_start|>", "<|im_end|>", "<|im_sep|>", "<|endoftext|>", "<|start|>", "<|message|>", "<|channel|>",
        "<|return|>", "<|call|>",
    ),
    "Llama 3": (
        "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
        "<|eom_id|>", "<|python_tag|>",
    ),
    "Gemma": ("<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>"),
    "Mistral": (
        "[INST]", "[/INST]", "<s>", "</s>", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CALLS]",
        "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]",
    ),
    "DeepSeek": (
        "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
        "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>",
    ),
    "Phi / GLM": (
        "<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|observation|>", "[gMASK]", "<sop>", "<eop>",
    ),
})
"""The control strings of each model family, as their tokenizers define them."""

_GENERIC = (
    r"<\|[A-Za-z0-9_.:\-]{1,64}\|>",  # any <|name|>: ChatML, Llama 3, Phi, GLM, reserved tokens
    "<\uff5c[^\uff5c\n<>]{1,64}\uff5c>",  # any <｜name｜>: DeepSeek
)
_LITERALS = sorted({s for strings in CONTROL_STRINGS.values() for s in strings}, key=len, reverse=True)
_PATTERN: Final = re.compile("|".join([*_GENERIC, *map(re.escape, _LITERALS)]))


def _break(match: re.Match[str]) -> str:
    text = match.group()
    return text[0] + BREAK + text[1:]


def neutralise(text: str) -> str:
    """``text`` with every control string broken by a zero-width space after its first character.

    ``<|im_start|>`` becomes ``<\\u200b|im_start|>``, ``[INST]`` becomes ``[\\u200bINST]``;
    everything else is left as typed. Idempotent: a broken string no longer matches.
    """
    if not text:
        return text
    return _PATTERN.sub(_break, text)


def has_control_string(text: str) -> bool:
    """Whether ``text`` holds a control string `neutralise` would break."""
    return bool(_PATTERN.search(text))
