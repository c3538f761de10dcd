"""The rewrite verifier: every rewriter's output (offline or LLM) passes through it.

A rewrite is a *hint* until it passes four checks against the message and the
memory it may draw on (the recent user/assistant turns and the summary; engine
notices, prompts and templates are never sources):

1. **Content kept.** Every content word of the message (not a pronoun,
   demonstrative, particle or punctuation) is still in the rewrite.
2. **Additions grounded.** Every word the rewrite adds appears in a source, as
   written (a Chinese span as a substring of one source, a Latin word as a whole
   word of one source).
3. **Latin words keep their spaces.** A Latin run of the rewrite that is not in the
   message must be a whole word of a source: "GreenTea" out of "Green Tea" fails.
4. **Sane length.** At most ``MAX_RATIO`` times the message plus ``MAX_EXTRA``
   characters, and not empty.

`verify_rewrite` returns a `Verdict`; `verified` runs a `Rewriter` and applies it,
so the engine and ``contextmode eval rewrite`` share one path.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..text import analyze_text, is_chinese
from ..types import Turn
from .base import Rewrite, Rewriter

__all__ = [
    "MAX_EXTRA",
    "MAX_RATIO",
    "Verdict",
    "check",
    "rewrite_sources",
    "verified",
    "verify_rewrite",
]

MAX_RATIO = 3.0
"""A rewrite may be at most this many times as long as the message (plus `MAX_EXTRA`)."""
MAX_EXTRA = 24
"""Characters always allowed on top of `MAX_RATIO` (a short message can gain a name)."""

_LATIN = re.compile(r"[A-Za-z][A-Za-z0-9'\-]*")
_EN_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'\-]*")
_SKIP = re.compile(r"[\s\W_]+", re.UNICODE)
_ZH_REPLACEABLE = frozenset(
    ["他", "她", "它", "他们", "她们", "它们", "这", "那", "这个", "那个", "这些", "那些", "这里", "那里",
     "这儿", "那儿", "这边", "那边", "其", "此", "该", "这样", "那样", "这么", "那么", "之",
     "吗", "呢", "吧", "啊", "呀", "嘛", "哦", "哈", "啦", "么", "的", "了", "嗯", "呗", "哇", "咯"]
)
_EN_REPLACEABLE = frozenset(
    ["he", "she", "it", "they", "him", "her", "them", "his", "hers", "its", "their", "theirs",
     "this", "that", "these", "those", "there", "here", "one", "the", "a", "an", "s", "'s"]
)


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """Whether a rewrite may be used, and why not."""

    ok: bool
    reason: str = ""
    """Why it was rejected (empty when accepted)."""
    added: tuple[str, ...] = ()
    """The spans the rewrite adds to the message."""


def _zh_words(text: str) -> tuple[str, ...]:
    return analyze_text(text).words


def _content_words(message: str) -> list[str]:
    if is_chinese(message):
        return [w for w in _zh_words(message)
                if w not in _ZH_REPLACEABLE and _SKIP.sub("", w)]
    return [w.lower() for w in _EN_WORD.findall(message) if w.lower() not in _EN_REPLACEABLE]


def _added_spans(message: str, rewrite: str) -> list[str]:
    """What ``rewrite`` inserts into ``message`` (characters for Chinese, words otherwise)."""
    if is_chinese(message) or is_chinese(rewrite):
        matcher = difflib.SequenceMatcher(None, message, rewrite, autojunk=False)
        spans = [rewrite[j1:j2] for op, _i1, _i2, j1, j2 in matcher.get_opcodes()
                 if op in ("insert", "replace")]
    else:
        old = [w.lower() for w in _EN_WORD.findall(message)]
        new = [w.lower() for w in _EN_WORD.findall(rewrite)]
        matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
        spans = [" ".join(new[j1:j2]) for op, _i1, _i2, j1, j2 in matcher.get_opcodes()
                 if op in ("insert", "replace")]
    return [s for s in (_SKIP.sub(" ", span).strip() for span in spans) if s]


def _latin_in(word: str, sources: Sequence[str]) -> bool:
    pattern = re.compile(rf"(?<![A-Za-z0-9]){re.escape(word)}(?![A-Za-z0-9])", re.I)
    return any(pattern.search(s) for s in sources)


def _grounded(span: str, sources: Sequence[str]) -> bool:
    """``span`` appears in one source: each Latin word whole, each Chinese run as written."""
    for latin in _LATIN.findall(span):
        if not _latin_in(latin, sources):
            return False
    chinese = [part for part in _LATIN.split(span) if _SKIP.sub("", part)]
    lowered = [s.lower() for s in sources]
    for part in chinese:
        for piece in part.split():
            if not any(piece.lower() in s for s in lowered):
                return False
    return True


def verify_rewrite(message: str, rewrite: str, sources: Sequence[str]) -> Verdict:
    """Check ``rewrite`` of ``message`` against the texts it may draw on (see the module docstring)."""
    text, original = rewrite.strip(), message.strip()
    if not text:
        return Verdict(ok=False, reason="empty rewrite")
    if text == original:
        return Verdict(ok=True)
    if len(text) > MAX_RATIO * len(original) + MAX_EXTRA:
        return Verdict(ok=False, reason=f"too long ({len(text)} characters for {len(original)})")
    lowered = text.lower()
    if is_chinese(original):
        missing = [w for w in _content_words(original) if w.lower() not in lowered]
    else:
        kept = {w.lower() for w in _EN_WORD.findall(text)}
        missing = [w for w in _content_words(original) if w not in kept]
    if missing:
        return Verdict(ok=False, reason="drops the message's words: " + ", ".join(missing[:5]))
    message_latin = {w.lower() for w in _LATIN.findall(original)}
    for word in _LATIN.findall(text):
        if word.lower() not in message_latin and not _latin_in(word, sources):
            return Verdict(ok=False, reason=f"word not in the conversation as written: {word}")
    added = _added_spans(original, text)
    for span in added:
        if not _grounded(span, sources):
            return Verdict(ok=False, reason=f"adds words not in the conversation: {span}",
                           added=tuple(added))
    return Verdict(ok=True, added=tuple(added))


def rewrite_sources(history: Sequence[Turn], summary: str | None) -> list[str]:
    """What a rewrite may draw on: user and assistant turns that are not engine notices, and the summary."""
    sources = [t.content for t in history if t.role in ("user", "assistant") and not t.notice]
    if summary and summary.strip():
        sources.append(summary)
    return sources


async def verified(
    rewriter: Rewriter, message: str, history: Sequence[Turn], *, summary: str | None = None
) -> tuple[Rewrite, Rewrite | None]:
    """Run ``rewriter`` on the non-notice ``history`` and verify its output.

    Returns ``(rewrite, rejected)``: the rewrite to use (unchanged when rejected) and,
    when the verifier refused a change, the refused rewrite with its reason.
    """
    usable = [t for t in history if not t.notice]
    result = await rewriter.rewrite(message, usable, summary=summary)
    return check(message, result, rewrite_sources(usable, summary))


def check(message: str, result: Rewrite, sources: Sequence[str]) -> tuple[Rewrite, Rewrite | None]:
    """Apply `verify_rewrite` to one rewriter ``result``: ``(rewrite to use, rejected or None)``."""
    if not result.changed:
        return result, None
    verdict = verify_rewrite(message, result.text, sources)
    if verdict.ok:
        return replace(result, verified=True), None
    rejected = replace(result, reason=verdict.reason)
    return Rewrite(text=message, changed=False, source=result.source), rejected
