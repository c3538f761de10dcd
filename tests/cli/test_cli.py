"""The ``contextmode`` command as a user runs it (a subprocess): one-line errors, the demo's
temporary store, and ``inspect --turn N --json`` equal to the HTTP route's data."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from contextmode.api import build_engine
from contextmode.settings import EngineSettings
from contextmode.testing.models import FunctionModel
from contextmode.types import NewTurn, SessionKey

SRC = Path(__file__).resolve().parents[2] / "src"


def run_cli(*args: str, home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {
        k: v for k, v in os.environ.items() if not k.startswith("CONTEXTMODE_") and k != "PYTHONPATH"
    }
    environ.update(PYTHONPATH=str(SRC), CONTEXTMODE_HOME=str(home), NO_COLOR="1", COLUMNS="200", **env)
    # _BLOCK=name: run as if that package were not installed.
    block = environ.pop("_BLOCK", "")
    return subprocess.run(
        [sys.executable, "-c", f"import sys; sys.modules.update(dict.fromkeys({block.split()!r})); "
         "from contextmode.cli import main; main()", *args],
        capture_output=True, text=True, env=environ, timeout=300,
    )


def lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]


def test_serve_with_an_unknown_store_url_says_so_in_one_line(tmp_path: Path) -> None:
    result = run_cli("serve", home=tmp_path, CONTEXTMODE_STORE_URL="foo://nowhere")
    assert result.returncode == 2
    out = lines(result)
    assert len(out) <= 2, out
    assert "CONTEXTMODE_STORE_URL" in out[0] and "foo://nowhere" in out[0] and "sqlite://" in out[0]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("missing", ["fastapi", "uvicorn"])
def test_serve_without_the_service_extra_is_one_line_and_exit_2(tmp_path: Path, missing: str) -> None:
    # The README's basic install (no service extra): the module cannot be imported.
    result = run_cli("serve", home=tmp_path, _BLOCK=missing)
    assert result.returncode == 2
    assert lines(result) == [f"error: '{missing}' is not installed: pip install 'contextmode-engine[service]'"]


def test_a_bad_budget_setting_is_one_line_and_debug_shows_the_traceback(tmp_path: Path) -> None:
    result = run_cli("inspect", "s", home=tmp_path, CONTEXTMODE_CONTEXT_WINDOW="lots")
    assert result.returncode == 2
    assert lines(result) == ["error: CONTEXTMODE_CONTEXT_WINDOW must be a whole number, got 'lots'"]
    debug = run_cli("--debug", "inspect", "s", home=tmp_path, CONTEXTMODE_CONTEXT_WINDOW="lots")
    assert debug.returncode != 0 and "Traceback" in debug.stderr


def test_replay_of_an_unknown_format_fails_and_lists_the_accepted_ones(tmp_path: Path) -> None:
    odd = tmp_path / "chat.jsonl"
    odd.write_text('{"question": "你好", "reply": "你好！"}\n', encoding="utf-8")
    result = run_cli("replay", str(odd), home=tmp_path)
    assert result.returncode == 2
    (line,) = lines(result)
    assert "unrecognised" in line and '"role"' in line and '"user"' in line
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n", encoding="utf-8")
    assert run_cli("replay", str(empty), home=tmp_path).returncode == 2


def test_the_demo_never_touches_the_users_store(tmp_path: Path) -> None:
    home = tmp_path / "home"
    mine = f"sqlite:///{tmp_path / 'mine.db'}"

    async def write_mine() -> None:
        engine = build_engine(store=mine)
        await engine.store.append(SessionKey("local", "demo"), [NewTurn(role="user", content="我的数据", tokens=3)])
        await engine.close()

    asyncio.run(write_mine())
    result = run_cli("demo", home=home, CONTEXTMODE_STORE_URL=mine)
    assert result.returncode == 0, result.stderr
    assert "temporary" in result.stdout

    async def read_mine() -> list[str]:
        engine = build_engine(store=mine)
        turns = await engine.store.turns(SessionKey("local", "demo"))
        await engine.close()
        return [t.content for t in turns]

    assert asyncio.run(read_mine()) == ["我的数据"]
    # Told to use that store, it refuses to overwrite the existing session.
    refused = run_cli("demo", "--store", mine, home=home)
    assert refused.returncode == 2 and len(lines(refused)) == 1 and "--session" in lines(refused)[0]


def test_inspect_turn_json_is_the_routes_data(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    import httpx

    from contextmode.service import ServiceSettings, create_app

    url = f"sqlite:///{tmp_path / 'cm.db'}"

    async def chat() -> dict[str, Any]:
        engine = build_engine(store=url, model=FunctionModel(lambda m: f"答：{m[-1].content}"))
        app = create_app(engine, ServiceSettings(image_dir=tmp_path / "images"))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            for text in ("我不吃辣", "推荐一家餐厅", "人均多少钱？"):
                await client.post("/v1/sessions/demo/messages", json={"message": text})
            body: dict[str, Any] = (await client.get("/v1/sessions/demo/turns/2/context")).json()
        await engine.close()
        return body

    body = chat_body = asyncio.run(chat())
    assert body["code"] == 0
    result = run_cli("inspect", "demo", "--turn", "2", "--json", "--store", url, home=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == chat_body["data"]
    table = run_cli("inspect", "demo", "--turn", "2", "--store", url, home=tmp_path)
    assert "推荐一家餐厅" in table.stdout and "turn 2" in table.stdout
    missing = run_cli("inspect", "demo", "--turn", "7", "--store", url, home=tmp_path)
    assert missing.returncode == 1 and len(lines(missing)) == 1


async def test_inspect_explains_recall_with_the_query_recall_was_given() -> None:
    """``inspect`` says why a turn was recalled as the turn's trace does (`trace.recalled_turns`):
    with the message recall searched for, not a rewrite the verifier did not accept."""
    from dataclasses import replace

    from contextmode.cli.app import _recall_reasons
    from contextmode.engine.trace import recalled_turns
    from contextmode.processors.base import Rewrite

    # A window smaller than the conversation: the locker turn comes back through recall.
    engine = build_engine(store="memory://", model=FunctionModel(lambda m: "ok"),
                          settings=EngineSettings(context_window=300))
    turns = [NewTurn(role="user", content="My locker code at the gym is 4417, please remember it.", tokens=12),
             NewTurn(role="assistant", content="Noted, your gym locker code is 4417.", tokens=9)]
    for n in range(30):
        turns += [NewTurn(role="user", content=f"How many minutes are in {n + 2} hours?", tokens=8),
                  NewTurn(role="assistant", content=f"{(n + 2) * 60} minutes.", tokens=3)]
    await engine.store.append(SessionKey("local", "s"), turns)
    prepared = await engine.prepare("local", "s", "What was my locker code at the gym?")
    rejected = Rewrite(text="How many minutes in 5 hours?", changed=True, verified=False)
    reasons = _recall_reasons(replace(prepared, rewrite=rejected))
    await engine.close()
    expected = [{"seq": r.seq, "score": r.score, "matched": list(r.matched), "neighbour_of": r.neighbour_of,
                 "ranker": r.ranker} for r in recalled_turns(prepared) if r.layer == "recall"]
    assert reasons == expected
    locker = next(r for r in reasons if r["seq"] == 1)
    assert locker["matched"] and json.loads(json.dumps(locker)) == locker  # the message's terms; JSON as before


def test_inspect_names_every_stored_turn_by_its_exchange_number(tmp_path: Path) -> None:
    """One numbering: the CLI says "turn 2" (the second user message) and "turn 2's answer",
    never a storage sequence number, in the session view and in a past turn's view."""
    url = f"sqlite:///{tmp_path / 'cm.db'}"

    async def chat() -> None:
        # The ``default`` strategy shows the pins (a steady window leaves those said inside it to it).
        engine = build_engine(store=url, model=FunctionModel(lambda m: "好的。"), settings=EngineSettings(strategy="default"))
        for text in ("我不吃辣，预算五十以内。", "推荐一家餐厅", "那家店在哪？", "人均多少钱？"):
            await engine.turn("local", "s", text)
            await engine.drain()
        await engine.close()

    asyncio.run(chat())
    past = run_cli("inspect", "s", "--turn", "3", "--store", url, home=tmp_path)
    assert past.returncode == 0, past.stderr
    assert "turn 3 as the model received it" in past.stdout
    assert "pinned at turn 3 (as they were then):" in past.stdout
    assert "📌 不吃辣 (from turn 1)" in past.stdout
    assert "seq" not in past.stdout
    now = run_cli("inspect", "s", "--store", url, home=tmp_path)
    assert now.returncode == 0, now.stderr
    assert "seq" not in now.stdout and "message 1" not in now.stdout and "recalled message" not in now.stdout
    assert "turn n = the n-th user message" in now.stdout


def test_chat_help_lists_every_command_in_two_aligned_columns(tmp_path: Path) -> None:
    from contextmode.cli.chat import HELP

    environ = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTMODE_") and k != "PYTHONPATH"}
    environ.update(PYTHONPATH=str(SRC), CONTEXTMODE_HOME=str(tmp_path), NO_COLOR="1", COLUMNS="120")
    result = subprocess.run(
        [sys.executable, "-c", "from contextmode.cli import main; main()", "chat", "--store", "memory://"],
        input="/help\n/quit\n", capture_output=True, text=True, env=environ, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.lstrip("你> ").startswith("/")]
    rows = [line[line.index("/"):] for line in rows]
    assert [r.split("  ")[0] for r in rows] == [command for command, _ in HELP]  # "[message]" kept
    columns = {r.index(what) for r, (_, what) in zip(rows, HELP, strict=True)}
    assert len(columns) == 1, rows


def test_ctrl_l_clears_the_screen_in_chat(tmp_path: Path) -> None:
    """In a terminal, Ctrl+L at chat's prompt clears the screen (line editing), never echoes ``^L``."""
    pty = pytest.importorskip("pty")
    import select
    import termios
    import time

    environ = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTMODE_") and k != "PYTHONPATH"}
    environ.update(PYTHONPATH=str(SRC), CONTEXTMODE_HOME=str(tmp_path), TERM="xterm", NO_COLOR="1")
    pid, fd = pty.fork()
    if pid == 0:  # the child: chat on the pseudo-terminal
        os.execve(sys.executable, [sys.executable, "-c", "from contextmode.cli import main; main()",
                                   "chat", "--store", "memory://"], environ)
    shown = b""

    def read_until(marker: bytes, seconds: float) -> None:
        nonlocal shown
        end = time.monotonic() + seconds
        while marker not in shown and time.monotonic() < end:
            if select.select([fd], [], [], 0.2)[0]:
                try:
                    shown += os.read(fd, 4096)
                except OSError:
                    return

    try:
        read_until(b"> ", 120)  # the prompt
        assert b"> " in shown, shown
        # The prompt is printed before input() runs: wait until line editing holds the terminal
        # (canonical mode off), as a person typing a moment later would.
        end = time.monotonic() + 30
        while termios.tcgetattr(fd)[3] & termios.ICANON and time.monotonic() < end:
            time.sleep(0.05)
        before = len(shown)
        os.write(fd, b"\x0c")
        read_until(b"\x1b[2J", 30)
        cleared = shown[before:]
        assert b"\x1b[2J" in cleared and b"^L" not in cleared
        os.write(fd, b"/quit\n")
        read_until(b"/quit", 30)
    finally:
        os.close(fd)
        os.waitpid(pid, 0)
