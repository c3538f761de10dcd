"""`OfflineResponder`: the answer when no model is configured.

It says plainly that no model is configured (in Chinese when the user wrote
Chinese) and shows what would have been sent: the standalone question and a
compact view of every message (role, token count when a counter is given, first
characters). That makes the default install useful for inspecting context.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from ..text.lang import is_chinese
from ..tokens.base import TokenCounter
from ..tokens.tools import count_messages
from ..types import NOTICE_PREFIXES, ChatMessage

__all__ = ["OfflineResponder"]


def _preview(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "…"


class OfflineResponder:
    """A `ChatModel` that needs no model: it describes the request instead of answering it."""

    def __init__(
        self,
        *,
        counter: TokenCounter | None = None,
        preview_chars: int = 80,
        chunk_chars: int = 24,
        name: str = "offline",
        max_listed: int = 6,
    ) -> None:
        """``counter`` adds token totals; ``preview_chars`` characters of each message are shown;
        the answer streams in pieces of ``chunk_chars`` characters; at most ``max_listed``
        messages are listed (the first and the newest, a line says how many between)."""
        self.name = name
        self.counter = counter
        self.preview_chars = preview_chars
        self.chunk_chars = max(1, chunk_chars)
        self.max_listed = max(2, max_listed)

    def __repr__(self) -> str:
        return f"OfflineResponder(name={self.name!r})"

    def render(self, messages: Sequence[ChatMessage]) -> str:
        """The full offline answer for ``messages``."""
        question = next((m.content for m in reversed(messages) if m.role == "user"), "")
        zh = is_chinese(question)
        lines = [
            NOTICE_PREFIXES[0] + "context-mode 没有连接任何语言模型，所以这里不生成回答。"
            "设置 CONTEXTMODE_LLM_BASE_URL 和 CONTEXTMODE_LLM_MODEL 后即可得到真正的回答。"
            if zh
            else NOTICE_PREFIXES[1] + " context-mode is not connected to a language model, so no "
            "answer is generated here. Set CONTEXTMODE_LLM_BASE_URL and CONTEXTMODE_LLM_MODEL to get "
            "real answers.",
            "",
            ("独立问题：" if zh else "Standalone question: ") + _preview(question, 500),
            "",
        ]
        total = count_messages(self.counter, messages) if self.counter else None
        if zh:
            head = f"将发送给模型的内容（{len(messages)} 条消息"
            head += f"，共 {total} tokens）：" if total is not None else "）："
        else:
            head = f"What the model would have received ({len(messages)} messages"
            head += f", {total} tokens in total):" if total is not None else "):"
        lines.append(head)
        # A long context is listed by its ends (the system prompt, the newest messages): the
        # notice stays a few lines; the inspector shows every message.
        listed = list(enumerate(messages, 1))
        skipped = len(listed) - self.max_listed
        if skipped > 0:
            listed = listed[:1] + listed[1 + skipped:]
        for index, message in listed:
            if skipped > 0 and index == skipped + 2:
                lines.append(f"…（中间另有 {skipped} 条）" if zh else f"… ({skipped} more in between)")
            tokens = f" {self.counter.count(message.content)} tokens" if self.counter else ""
            # Earlier answers are not quoted: they are stored as turns, and quoting them
            # would make every offline answer grow with the ones before it.
            preview = "" if message.role == "assistant" else " " + _preview(message.content, self.preview_chars)
            lines.append(f"{index}. [{message.role}{tokens}]{preview}")
        return "\n".join(lines)

    async def complete(self, messages: Sequence[ChatMessage], *, max_tokens: int | None = None) -> str:
        """The offline answer at once (``max_tokens`` is ignored: it is a description, not a reply)."""
        return self.render(messages)

    async def stream(
        self, messages: Sequence[ChatMessage], *, max_tokens: int | None = None
    ) -> AsyncIterator[str]:
        """The offline answer in small chunks, yielding to the event loop between them."""
        text = self.render(messages)
        for start in range(0, len(text), self.chunk_chars):
            yield text[start : start + self.chunk_chars]
            await asyncio.sleep(0)
