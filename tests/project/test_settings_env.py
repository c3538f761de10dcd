"""env_int: the one whole-number reader behind every ``*Settings.from_env``."""

from __future__ import annotations

import pytest

from contextmode.errors import ConfigError
from contextmode.service.settings import ServiceSettings
from contextmode.settings import EngineSettings, env_int


def test_env_int_default_when_unset_or_blank() -> None:
    assert env_int({}, "CONTEXTMODE_X", 7) == 7
    assert env_int({"CONTEXTMODE_X": ""}, "CONTEXTMODE_X", 7) == 7
    assert env_int({"CONTEXTMODE_X": "  "}, "CONTEXTMODE_X", 7) == 7


def test_env_int_parses_and_strips() -> None:
    assert env_int({"CONTEXTMODE_X": " 42 "}, "CONTEXTMODE_X", 7) == 42


def test_env_int_rejects_non_numbers_and_small_values() -> None:
    with pytest.raises(ConfigError, match="CONTEXTMODE_X must be a whole number"):
        env_int({"CONTEXTMODE_X": "4.5"}, "CONTEXTMODE_X", 7)
    with pytest.raises(ConfigError, match="CONTEXTMODE_X must be at least 3, got 2"):
        env_int({"CONTEXTMODE_X": "2"}, "CONTEXTMODE_X", 7, minimum=3)


def test_both_settings_use_it() -> None:
    assert EngineSettings.from_env({"CONTEXTMODE_CONTEXT_WINDOW": "4096"}).context_window == 4096
    assert ServiceSettings.from_env({"CONTEXTMODE_PORT": "9001"}).port == 9001
    with pytest.raises(ConfigError, match="CONTEXTMODE_PORT"):
        ServiceSettings.from_env({"CONTEXTMODE_PORT": "eighty"})
