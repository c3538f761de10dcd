"""LlamaIndex: LoCoMo questions through `ContextModeMemory` (read-only over the recorded
conversation), as the messages a chat engine or agent gets from ``memory.aget()``."""

from __future__ import annotations

from pathlib import Path

from _locomo import Ask, Clock, Replayed, measure_with
from llama_index.core.base.llms.types import ChatMessage, MessageRole

from contextmode.integrations.llama_index import ContextModeMemory

NAME = "llama_index"
_SECTIONS = ("<key_moments>", "<recall>")


def _ask(replayed: Replayed) -> tuple[Ask, Clock]:
    clock = Clock(replayed.memory, ("acontext",))
    memory = ContextModeMemory(replayed.session_id, memory=replayed.memory, record=False)

    async def ask(question: str) -> tuple[list[str], list[str]]:
        await memory.aput(ChatMessage(role=MessageRole.USER, content=question))
        handed = await memory.aget()
        verbatim = [m.content or "" for m in handed if m.role != MessageRole.SYSTEM]
        sections = [m.content or "" for m in handed
                    if m.role == MessageRole.SYSTEM and any(tag in (m.content or "") for tag in _SECTIONS)]
        return verbatim, sections

    return ask, clock


def measure(data_dir: Path, budget: int, limit: int | None) -> dict[str, float]:
    return measure_with(data_dir, budget, limit, _ask)
