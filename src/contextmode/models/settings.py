"""Settings of the model layer, read from ``CONTEXTMODE_LLM_*`` env vars, and the request guard."""

from __future__ import annotations

import ipaddress
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

from ..errors import ConfigError
from ..settings import env_flag, env_int

__all__ = [
    "ALLOW_MODEL_REQUESTS_ENV",
    "LLMSettings",
    "ResponseFormatMode",
    "check_model_request_allowed",
    "is_loopback_url",
]

ALLOW_MODEL_REQUESTS_ENV = "CONTEXTMODE_ALLOW_MODEL_REQUESTS"
"""Set to ``0`` (tests do) to refuse any model request that would leave this machine."""

_FALSE = {"0", "false", "no", "off"}

ResponseFormatMode = Literal["auto", "json_schema", "json_object", "none"]
"""How structured output is asked for: ``auto`` (by server kind, see `models.server`), OpenAI's
``json_schema``, llama.cpp's ``json_object`` with a ``schema``, or ``none`` (the prompt alone)."""
_FORMATS: tuple[ResponseFormatMode, ...] = ("auto", "json_schema", "json_object", "none")


@dataclass(frozen=True, kw_only=True)
class LLMSettings:
    """How to reach an OpenAI-compatible chat-completions endpoint.

    ``from_env`` reads ``CONTEXTMODE_LLM_BASE_URL``, ``CONTEXTMODE_LLM_API_KEY``,
    ``CONTEXTMODE_LLM_MODEL``, ``CONTEXTMODE_LLM_TIMEOUT`` (seconds),
    ``CONTEXTMODE_LLM_MAX_RETRIES``, ``CONTEXTMODE_LLM_TEMPERATURE`` and
    ``CONTEXTMODE_LLM_EXTRA_HEADERS`` (a JSON object), ``CONTEXTMODE_LLM_REPLY_MAX_TOKENS``,
    ``CONTEXTMODE_LLM_DEADLINE_S``, ``CONTEXTMODE_LLM_RESPONSE_FORMAT``, ``CONTEXTMODE_LLM_SLOTS``
    and ``CONTEXTMODE_LLM_BACKGROUND_WAIT_S``.
    """

    base_url: str | None = None
    """Endpoint root including ``/v1`` (``None`` = api.openai.com)."""
    api_key: str | None = field(default=None, repr=False)
    """Secret; never shown by ``repr`` or in errors."""
    model: str | None = None
    """Model name sent with each request (``gpt-4o-mini``, ``deepseek-chat``, ``qwen-plus``…)."""
    timeout: float = 60.0
    """Seconds allowed for connecting and for each read (a stream stalled this long fails)."""
    max_retries: int = 2
    """Retries of the openai client on connection errors, 408/409/429 and 5xx (with backoff)."""
    temperature: float | None = None
    """Sampling temperature; ``None`` leaves the server default."""
    extra_headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    """Extra HTTP headers sent with every request (they may hold secrets, so not in ``repr``)."""
    reply_max_tokens: int | None = 1024
    """``max_tokens`` of a reply when the caller sets none (``0`` in the env = no cap)."""
    deadline: float | None = 120.0
    """Wall-clock seconds one call may take in all; a reply stream past it stops cleanly,
    keeping what arrived (``0`` in the env = none)."""
    response_format: ResponseFormatMode = "auto"
    """Structured-output wire format for processors that expect JSON."""
    slots: int | None = None
    """Requests the endpoint answers at once: ``None`` = as the server says (llama.cpp's
    ``total_slots``, 1 for llama-cpp-python, else no limit); ``0`` = no limit. With a limit,
    replies go before background jobs' calls (`models.priority`)."""
    background_wait_s: float | None = 30.0
    """Seconds a background job's call waits for a free slot before it gives up (``0`` in the
    env = no limit; the job's own timeout still applies)."""
    valid_text: bool = True
    """Ask a server that stalls on broken text (llama-cpp-python) for valid UTF-8 in text calls
    written in a script of multi-byte characters (`ServerInfo.stalls_on_broken_text`;
    ``CONTEXTMODE_LLM_VALID_TEXT=0`` = never)."""

    @property
    def configured(self) -> bool:
        """True when a model is named (a base URL alone is not enough to call anything)."""
        return bool(self.model)

    def __repr__(self) -> str:
        key = "set" if self.api_key else "unset"
        return (
            f"LLMSettings(base_url={self.base_url!r}, model={self.model!r}, api_key=<{key}>, "
            f"timeout={self.timeout}, max_retries={self.max_retries}, temperature={self.temperature})"
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LLMSettings:
        """Read the settings from ``env`` (default ``os.environ``); raise `ConfigError` on bad values."""
        env = os.environ if env is None else env

        def text(name: str) -> str | None:
            value = env.get(f"CONTEXTMODE_LLM_{name}", "").strip()
            return value or None

        base_url, model = text("BASE_URL"), text("MODEL")
        if base_url and not model:
            raise ConfigError("CONTEXTMODE_LLM_BASE_URL is set but CONTEXTMODE_LLM_MODEL is not")
        headers: dict[str, str] = {}
        if raw_headers := text("EXTRA_HEADERS"):
            try:
                parsed = json.loads(raw_headers)
            except ValueError:
                parsed = None
            if not isinstance(parsed, dict):
                raise ConfigError("CONTEXTMODE_LLM_EXTRA_HEADERS must be a JSON object of strings")
            headers = {str(k): str(v) for k, v in parsed.items()}
        timeout = _number(text("TIMEOUT"), "CONTEXTMODE_LLM_TIMEOUT", 60.0)
        retries = _number(text("MAX_RETRIES"), "CONTEXTMODE_LLM_MAX_RETRIES", 2)
        temperature = text("TEMPERATURE")
        if timeout <= 0 or retries < 0 or int(retries) != retries:
            raise ConfigError("CONTEXTMODE_LLM_TIMEOUT must be > 0 and CONTEXTMODE_LLM_MAX_RETRIES an integer >= 0")
        reply_cap = _number(text("REPLY_MAX_TOKENS"), "CONTEXTMODE_LLM_REPLY_MAX_TOKENS", 1024)
        deadline = _number(text("DEADLINE_S"), "CONTEXTMODE_LLM_DEADLINE_S", 120.0)
        if reply_cap < 0 or int(reply_cap) != reply_cap or deadline < 0:
            raise ConfigError(
                "CONTEXTMODE_LLM_REPLY_MAX_TOKENS must be an integer >= 0 and CONTEXTMODE_LLM_DEADLINE_S >= 0"
            )
        slots, background_wait = _gate_settings(env)
        fmt = (text("RESPONSE_FORMAT") or "auto").lower()
        if fmt not in _FORMATS:
            raise ConfigError(f"CONTEXTMODE_LLM_RESPONSE_FORMAT must be one of {', '.join(_FORMATS)}, got {fmt!r}")
        return cls(
            base_url=base_url,
            api_key=text("API_KEY"),
            model=model,
            timeout=float(timeout),
            max_retries=int(retries),
            temperature=None if temperature is None else _number(temperature, "CONTEXTMODE_LLM_TEMPERATURE", 0.0),
            extra_headers=headers,
            reply_max_tokens=int(reply_cap) or None,
            deadline=float(deadline) or None,
            response_format=fmt,
            slots=slots,
            background_wait_s=background_wait,
            valid_text=env_flag(env, "CONTEXTMODE_LLM_VALID_TEXT", True),
        )


def _gate_settings(env: Mapping[str, str]) -> tuple[int | None, float | None]:
    """``slots`` and ``background_wait_s`` from ``CONTEXTMODE_LLM_SLOTS`` / ``…_BACKGROUND_WAIT_S``."""
    raw_slots = env.get("CONTEXTMODE_LLM_SLOTS", "").strip()
    slots = env_int(env, "CONTEXTMODE_LLM_SLOTS", 0) if raw_slots else None
    wait = _number(env.get("CONTEXTMODE_LLM_BACKGROUND_WAIT_S", "").strip() or None,
                   "CONTEXTMODE_LLM_BACKGROUND_WAIT_S", 30.0)
    if wait < 0:
        raise ConfigError("CONTEXTMODE_LLM_BACKGROUND_WAIT_S must be >= 0")
    return slots, float(wait) or None


def _number(raw: str | None, name: str, default: float) -> float:
    if raw is None:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None


def is_loopback_url(url: str | None) -> bool:
    """True when ``url`` points at this machine (``localhost``, ``127.0.0.0/8``, ``::1``)."""
    if not url:
        return False
    host = (urlsplit(url).hostname or "").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_model_request_allowed(base_url: str | None, env: Mapping[str, str] | None = None) -> None:
    """Raise `ConfigError` if ``CONTEXTMODE_ALLOW_MODEL_REQUESTS=0`` and ``base_url`` is not loopback.

    The test suite sets it so nothing talks to a real model by accident; the
    stub server on 127.0.0.1 stays reachable.
    """
    env = os.environ if env is None else env
    if env.get(ALLOW_MODEL_REQUESTS_ENV, "").strip().lower() in _FALSE and not is_loopback_url(base_url):
        raise ConfigError(
            f"model requests to {_host_of(base_url)} are disabled ({ALLOW_MODEL_REQUESTS_ENV}=0); "
            "use the stub server or a fake model in tests"
        )


def _host_of(url: str | None) -> str:
    return (urlsplit(url).hostname or url) if url else "api.openai.com (default base URL)"
