"""pydantic-ai: LoCoMo questions through `ContextModeHistory` (the history processor, read-only
over the recorded conversation), as the model's request for each question."""

from __future__ import annotations

from pathlib import Path

from _locomo import Ask, Clock, Replayed, measure_with
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    UserPromptPart,
)

from contextmode.integrations.pydantic_ai import ContextModeHistory

NAME = "pydantic_ai"
_SECTIONS = ("<key_moments>", "<recall>")


def _ask(replayed: Replayed) -> tuple[Ask, Clock]:
    clock = Clock(replayed.memory, ("acontext", "aturns_between"))
    history = ContextModeHistory(replayed.session_id, memory=replayed.memory, record=False)

    async def ask(question: str) -> tuple[list[str], list[str]]:
        messages: list[ModelMessage] = await history([ModelRequest(parts=[UserPromptPart(content=question)])])
        verbatim: list[str] = []
        sections: list[str] = []
        for m in messages:
            for p in m.parts:
                if isinstance(p, SystemPromptPart) and any(tag in p.content for tag in _SECTIONS):
                    sections.append(p.content)
                elif (isinstance(p, UserPromptPart) and isinstance(p.content, str)) or \
                        (isinstance(m, ModelResponse) and isinstance(p, TextPart)):
                    verbatim.append(str(p.content))
        return verbatim, sections

    return ask, clock


def measure(data_dir: Path, budget: int, limit: int | None) -> dict[str, float]:
    return measure_with(data_dir, budget, limit, _ask)
