"""A session an adapter stored under a framework's key (``user1/1-1dc5acabaf``) is named by
that key on the command line and in the service's session list, shown as given."""

from __future__ import annotations

import json
from pathlib import Path

from contextmode import ContextMode
from contextmode.service.schemas import SessionSummaryOut
from contextmode.session_keys import id_for_key
from contextmode.types import SessionKey

from .test_cli import run_cli

KEY = "user1/1-1dc5acabaf"


def test_inspect_takes_the_key_or_the_id(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cm.db'}"
    with ContextMode(store=url) as memory:
        memory.record(id_for_key(KEY), "user", "我不吃辣")
        info = memory.submit(memory.engine.store.info(SessionKey(memory.tenant, id_for_key(KEY)))).result()
    assert info is not None
    assert SessionSummaryOut.of(info).key == KEY
    for name in (KEY, id_for_key(KEY)):
        result = run_cli("inspect", name, "--json", "--store", url, home=tmp_path)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["session"] == KEY


def test_forget_takes_the_key(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cm.db'}"
    with ContextMode(store=url) as memory:
        memory.record(id_for_key(KEY), "user", "我不吃辣")
    result = run_cli("forget", "--session", KEY, "--store", url, home=tmp_path)
    assert result.returncode == 0, result.stderr
    with ContextMode(store=url) as memory:
        assert memory.turns(id_for_key(KEY)) == []
