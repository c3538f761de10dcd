"""LoCoMo evidence recall and per-turn overhead through `contextmode.integrations.langchain`
(the harness: `benchmarks/integrations/_locomo.py`).

    PYTHONPATH=src python -m benchmarks.integrations.langchain [data_dir] [budget] [limit]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks.integrations._locomo import measure_adapter
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from contextmode.integrations.langchain import context_to_messages, message_to_record

NAME = "langchain"


def _message(role: str, text: str) -> BaseMessage:
    return HumanMessage(text) if role == "user" else AIMessage(text)


def measure(data_dir: Path, budget: int, limit: int | None) -> dict[str, float]:
    """``recall`` (evidence recall on LoCoMo at ``budget`` tokens through the adapter),
    ``library_recall`` (the library's on the same questions), ``questions`` and
    ``overhead_ms_p50`` (per adapter call); ``limit``: at most this many questions."""
    return measure_adapter(data_dir, budget, limit, to_message=_message, to_record=message_to_record,
                           to_messages=context_to_messages)


if __name__ == "__main__":
    args = sys.argv[1:]
    print(json.dumps(measure(Path(args[0]) if args else Path("../shared/data"),
                             int(args[1]) if len(args) > 1 else 2000,
                             int(args[2]) if len(args) > 2 else None)))
