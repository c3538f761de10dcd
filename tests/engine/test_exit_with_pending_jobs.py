"""A script that exits right after its last turn: the background jobs its turns scheduled
(summary, pins, emotions) are finished before Python stops its worker threads, with nothing
on stderr (they used to fail with "cannot schedule new futures after shutdown")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import logging, sys
logging.basicConfig(level=logging.INFO)
from contextmode import ContextMode
from contextmode.integrations.llama_index import ContextModeMemory
from llama_index.core.base.llms.types import ChatMessage

cm = ContextMode(store=f"sqlite:///{sys.argv[1]}")
if sys.argv[2] == "write":
    for i in range(12):
        cm.record("script", "user", f"I am vegetarian and my cat is called Pixel ({i}). " * 4)
        cm.record("script", "assistant", "Noted, " * 30)
    memory = ContextModeMemory("adapter", memory=cm)   # an adapter's session too
    memory.put_messages([ChatMessage(role="user", content="I never eat spicy food."),
                         ChatMessage(role="assistant", content="Noted.")])
else:
    print(sorted(layer.name for layer in cm.context("script", "what is my cat called?").layers))
"""


def _run(tmp_path: Path, *args: str, window: int | None = None) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    # The summary due by count: the ``default`` strategy (a steady window's turns are folded in
    # once it drops them).
    env = {**os.environ, "CONTEXTMODE_HOME": str(tmp_path / "home"), "CONTEXTMODE_STRATEGY": "default"}
    if window is not None:
        env["CONTEXTMODE_CONTEXT_WINDOW"] = str(window)
    return subprocess.run([sys.executable, str(script), str(tmp_path / "s.db"), *args],
                          capture_output=True, text=True, env=env, timeout=240, check=False)


def test_exit_right_after_the_last_turn_finishes_the_jobs_quietly(tmp_path: Path) -> None:
    wrote = _run(tmp_path, "write")
    assert wrote.returncode == 0, wrote.stderr
    assert "cannot schedule" not in wrote.stderr
    assert "WARNING" not in wrote.stderr and "ERROR" not in wrote.stderr, wrote.stderr
    # A window smaller than the conversation, so the summary the jobs wrote is sent.
    read = _run(tmp_path, "read", window=800)
    assert read.returncode == 0, read.stderr
    assert "constraints" in read.stdout and "summary" in read.stdout, read.stdout
