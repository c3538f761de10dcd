"""LangChain: LoCoMo questions through `ContextModeMiddleware` (read-only over the recorded
conversation), as the messages ``create_agent``'s model is handed for each question."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from _locomo import Ask, Clock, Replayed, measure_with
from langchain_core.messages import HumanMessage, SystemMessage

from contextmode.integrations.langchain import ContextModeMiddleware

NAME = "langchain"
_SECTIONS = ("<key_moments>", "<recall>")


def _ask(replayed: Replayed) -> tuple[Ask, Clock]:
    clock = Clock(replayed.memory, ("acontext",))
    middleware = ContextModeMiddleware(replayed.session_id, memory=replayed.memory, record=False)

    async def ask(question: str) -> tuple[list[str], list[str]]:
        update = await middleware.abefore_model({"messages": [HumanMessage(question)]}, cast(Any, None))
        assert update is not None
        handed = update["messages"][1:]  # after the RemoveMessage that replaces the state's
        verbatim = [str(m.content) for m in handed if not isinstance(m, SystemMessage)]
        sections = [str(m.content) for m in handed
                    if isinstance(m, SystemMessage) and any(tag in str(m.content) for tag in _SECTIONS)]
        return verbatim, sections

    return ask, clock


def measure(data_dir: Path, budget: int, limit: int | None) -> dict[str, float]:
    return measure_with(data_dir, budget, limit, _ask)
