"""``contextmode import`` never merges two conversations, never writes from a damaged file.

A session the target already holds is refused (exit 2, nothing changed) unless it is identical
(skipped), ``--replace`` is given, or ``--as NEW_ID`` imports it under another id. The whole file
is checked first: a changed turn, a missing ``end`` line or footer writes nothing.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from typer.testing import CliRunner

from contextmode.cli.app import app as cli_app
from contextmode.store import open_store
from contextmode.types import NewTurn, SessionKey


def _turns(*texts: str) -> list[NewTurn]:
    return [NewTurn(role="user" if i % 2 == 0 else "assistant", content=t, tokens=2) for i, t in enumerate(texts)]


def _fill(url: str, session: str, user: str | None, *texts: str) -> None:
    async def body() -> None:
        store = open_store(url)
        try:
            await store.append(SessionKey("t", session), _turns(*texts), user_id=user)
        finally:
            await store.close()
    asyncio.run(body())


def _held(url: str, session: str) -> tuple[str | None, list[str]]:
    async def body() -> tuple[str | None, list[str]]:
        store = open_store(url)
        try:
            info = await store.info(SessionKey("t", session))
            return (info.user_id if info else None), [t.content for t in await store.turns(SessionKey("t", session))]
        finally:
            await store.close()
    return asyncio.run(body())


def test_import_refuses_an_existing_session_unless_told(tmp_path: Path) -> None:
    runner = CliRunner()
    source, target = f"sqlite:///{tmp_path / 's.db'}", f"sqlite:///{tmp_path / 't.db'}"
    _fill(source, "s1", "alice", "我住在杭州", "好的", "我养了一只猫", "记住了")
    _fill(target, "s1", "bob", "bob 的第一句", "嗯")
    export = tmp_path / "e.jsonl"
    assert runner.invoke(cli_app, ["export", str(export), "--store", source, "--quiet"]).exit_code == 0

    r = runner.invoke(cli_app, ["import", str(export), "--store", target, "--quiet"])
    assert r.exit_code == 2 and "--replace" in r.output and "--as" in r.output, r.output
    assert _held(target, "s1") == ("bob", ["bob 的第一句", "嗯"])  # untouched: no merge, owner kept

    r = runner.invoke(cli_app, ["import", str(export), "--store", target, "--quiet", "--as", "s1-copy"])
    assert r.exit_code == 0, r.output
    assert _held(target, "s1-copy") == ("alice", ["我住在杭州", "好的", "我养了一只猫", "记住了"])
    assert _held(target, "s1") == ("bob", ["bob 的第一句", "嗯"])

    r = runner.invoke(cli_app, ["import", str(export), "--store", target, "--quiet", "--replace"])
    assert r.exit_code == 0, r.output
    assert _held(target, "s1") == ("alice", ["我住在杭州", "好的", "我养了一只猫", "记住了"])

    # Importing the same file again: identical sessions are skipped, nothing is written twice.
    r = runner.invoke(cli_app, ["import", str(export), "--store", target, "--quiet"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == {"sessions": 0, "turns": 0, "skipped_sessions": 1}
    assert _held(target, "s1")[1] == ["我住在杭州", "好的", "我养了一只猫", "记住了"]


def test_a_damaged_export_writes_nothing(tmp_path: Path) -> None:
    runner = CliRunner()
    source = f"sqlite:///{tmp_path / 's.db'}"
    _fill(source, "s1", "alice", "第一句", "回答")
    _fill(source, "s2", "alice", "另一个会话", "回答二")
    export = tmp_path / "e.jsonl"
    assert runner.invoke(cli_app, ["export", str(export), "--store", source, "--quiet"]).exit_code == 0
    lines = export.read_text(encoding="utf-8").splitlines()
    changed = [line.replace("回答二", "篡改过") for line in lines]
    no_end = [line for line in lines if '"type":"end"' not in line or lines.index(line) != len(lines) - 2]
    no_footer = lines[:-1]
    for name, damaged, says in (("changed", changed, "checksum"), ("no_end", no_end, "end line"),
                                ("no_footer", no_footer, "footer")):
        assert damaged != lines, name
        path = tmp_path / f"{name}.jsonl"
        path.write_text("\n".join(damaged) + "\n", encoding="utf-8")
        target = f"sqlite:///{tmp_path / f'{name}.db'}"
        r = runner.invoke(cli_app, ["import", str(path), "--store", target, "--quiet"])
        assert r.exit_code == 2 and says in r.output, (name, r.output)
        assert _held(target, "s1") == (None, []), name  # the good first session was not written either
    # --as needs an export of one session.
    r = runner.invoke(cli_app, ["import", str(export), "--store", f"sqlite:///{tmp_path / 'x.db'}", "--as", "new"])
    assert r.exit_code == 2 and "one session" in r.output
