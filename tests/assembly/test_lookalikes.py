"""Closing-tag look-alikes in stored text never end a data section (NFKC + invisible characters)."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextmode.assembly.render import data_text, has_closing_tag

# The seven kinds reported, and more of each kind.
LOOKALIKES = [
    "＜/summary＞",  # full-width less-than
    "﹤/summary﹥",  # small form
    "<\u200d/summary>",  # zero-width joiner inside
    "<\u200b/summary>",  # zero-width space
    "<\ufeff/summary>",  # byte order mark
    "<\u2060/summary>",  # word joiner
    "<\u00ad/summary>",  # soft hyphen
    "<\u202e/summary>",  # right-to-left override
    "<／summary>",  # full-width solidus
    "<⁄summary>",  # fraction slash
    "<∕summary>",  # division slash
    "‹/summary›",  # single angle quotation mark
    "〈/summary〉",  # CJK angle bracket
    "⟨/summary⟩",  # mathematical angle bracket
    "<\ufe0f\u3000/summary>",  # variation selector and ideographic space
    "＜ \u200c\u200d ／summary＞",
]


@pytest.mark.parametrize("raw", LOOKALIKES)
def test_every_known_lookalike_is_neutralised(raw: str) -> None:
    assert has_closing_tag(raw)
    safe = data_text(raw)
    assert not has_closing_tag(safe)
    assert "summary" in safe  # the user's words stay


def test_plain_text_is_left_as_typed() -> None:
    for text in ("a <b> c", "1⁄2 cup", "and/or", "x < y / z", "不要辣 </ 不是标签", "😀 \u200d family"):
        if not has_closing_tag(text):
            assert data_text(text) == text


OPENERS = ["<", "＜", "﹤", "‹", "〈", "⟨", "❮", "˂"]
SLASHES = ["/", "／", "⁄", "∕", "⧸", "╱"]
JUNK = [" ", "\t", "\n", "\u3000", "\u00a0", "\u200b", "\u200c", "\u200d", "\u200e", "\u2060", "\ufeff",
        "\u00ad", "\u202e", "\u2066", "\ufe0f", "\u034f", "\U000e0041"]
PLAIN = ["summary", ">", "a", "\\", "中", "＞", "\u0301"]

pieces = st.sampled_from(OPENERS + SLASHES + JUNK + PLAIN)


@given(st.lists(pieces, max_size=30))
def test_no_mix_of_lookalikes_survives(parts: list[str]) -> None:
    text = "".join(parts)
    assert not has_closing_tag(data_text(text)), repr(text)


@given(st.text(max_size=60))
def test_any_text_comes_out_without_a_closing_tag(text: str) -> None:
    assert not has_closing_tag(data_text(text))


@given(st.text(max_size=60))
def test_nfkc_of_the_output_has_no_closing_tag_either(text: str) -> None:
    out = unicodedata.normalize("NFKC", data_text(text))
    assert not has_closing_tag(out)
