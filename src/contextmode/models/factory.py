"""`model_from_env`: the configured chat model, or the offline responder when none is."""

from __future__ import annotations

from collections.abc import Mapping

from ..tokens.base import TokenCounter
from .base import ChatModel
from .offline import OfflineResponder
from .settings import LLMSettings

__all__ = ["model_from_env"]


def model_from_env(
    env: Mapping[str, str] | None = None, *, counter: TokenCounter | None = None
) -> ChatModel:
    """An `OpenAIChatModel` when ``CONTEXTMODE_LLM_MODEL`` is set, else an `OfflineResponder`.

    ``counter`` only feeds the offline responder's token totals. Raises
    `ConfigError` for invalid settings and `MissingExtra` when the ``openai``
    extra is needed but not installed.
    """
    settings = LLMSettings.from_env(env)
    if not settings.configured:
        return OfflineResponder(counter=counter)
    from .openai import OpenAIChatModel

    return OpenAIChatModel.from_settings(settings)
