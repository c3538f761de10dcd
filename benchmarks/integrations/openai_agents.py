"""OpenAI Agents SDK: LoCoMo questions through `ContextModeSession.context_items` (what
``input_filter`` hands the model for a new message beyond the budget)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _locomo import Ask, Clock, Replayed, measure_with

from contextmode.integrations.openai_agents import ContextModeSession

NAME = "openai_agents"
_SECTIONS = ("<key_moments>", "<recall>")


def _ask(replayed: Replayed) -> tuple[Ask, Clock]:
    clock = Clock(replayed.memory, ("acontext", "acontinue", "aturns_between", "anewest"))
    session = ContextModeSession(replayed.session_id, memory=replayed.memory)

    async def ask(question: str) -> tuple[list[str], list[str]]:
        items: list[Any] = await session.context_items(question)
        texts = [i.get("content") for i in items if isinstance(i.get("content"), str)]
        sections = [t for i, t in zip(items, texts, strict=False) if i.get("role") == "system" and t.startswith("##")]
        verbatim = [str(i["content"]) for i in items if i.get("role") in ("user", "assistant") and isinstance(i.get("content"), str)]
        return verbatim, [s for s in sections if any(tag in s for tag in _SECTIONS)]

    return ask, clock


def measure(data_dir: Path, budget: int, limit: int | None) -> dict[str, float]:
    return measure_with(data_dir, budget, limit, _ask)
