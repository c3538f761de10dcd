"""Engine settings, read from ``CONTEXTMODE_*`` environment variables.

One dataclass per area: this one is the engine's (strategy, budget, mode,
background thresholds). The model's settings live in `contextmode.models.settings`,
the store's URL in `CONTEXTMODE_STORE_URL` (see `contextmode.store.open_store`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from .errors import ConfigError
from .pricing import DEFAULT_PRICES, Price, load_prices

__all__ = ["EngineSettings", "Mode", "PiiPolicy", "contextmode_home", "env_flag", "env_int"]

Mode = Literal["contextual", "decoupled"]
PiiPolicy = Literal["keep", "mask"]


def contextmode_home(env: Mapping[str, str] | None = None) -> Path:
    """The folder that holds all local state (``CONTEXTMODE_HOME``, default ``~/.contextmode``)."""
    env = os.environ if env is None else env
    return Path(env.get("CONTEXTMODE_HOME") or Path.home() / ".contextmode")


def env_int(env: Mapping[str, str], name: str, default: int, minimum: int = 0) -> int:
    """Whole number from ``env[name]``; ``default`` when unset or blank.

    Raises `ConfigError` naming the variable when the value is not a whole number
    or is below ``minimum``. Shared by every ``*Settings.from_env``.
    """
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value}")
    return value


def env_float(env: Mapping[str, str], name: str, default: float) -> float:
    """Number from ``env[name]``; ``default`` when unset or blank. Raises `ConfigError` naming
    the variable when the value is not a number."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None


def env_flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    """``True``/``False`` from ``env[name]`` (``1 true yes on`` / ``0 false no off``); ``default``
    when unset or blank. Raises `ConfigError` naming the variable for anything else."""
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name} must be 1 or 0 (true/false), got {raw!r}")


@dataclass(frozen=True, kw_only=True)
class EngineSettings:
    """How a turn is built and what runs after it."""

    strategy: str = "default"
    """Memory strategy name: ``default`` (summary, pins, key moments, recalled older turns and
    recent turns), or ``steady`` (the default with a request prefix that stays the same from turn
    to turn, for prompt caches: docs/caching.md), ``window``, ``token_window``, ``summary``,
    ``sliding_summary``, ``hybrid``, ``hybrid_recall``."""
    context_window: int = 8192
    """The model's context window, tokens."""
    reply_reserve: int | None = None
    """Tokens kept for the reply; ``None`` = a quarter of the window."""
    mode: Mode = "contextual"
    """``contextual``: layers go into the prompt; ``decoupled``: memory only feeds the rewrite."""
    order: str = "default"
    """Layer order preset: ``default`` (background, then the newest turns and the message; the
    messages alternate user/assistant), ``cache_first`` (instructions, pins, summary and the turns
    first, what changes every turn after them in one more user message: prompt caches reuse the
    rest, docs/caching.md) or ``question_first`` (the message right after the pinned constraints)."""
    locale: str = "auto"
    """``zh``, ``en`` or ``auto``."""
    summary_threshold: int = 10
    """Summarise when this many turns outside the recent window are not covered yet (5 exchanges)."""
    job_attempts: int = 3
    """Attempts per background job before it is given up (and recorded as failed)."""
    rewrite: bool = True
    """Rewrite context-dependent messages into standalone questions."""
    response_share: float = 1.0
    """The response path's memory calls to a model (detection and rewriting, before the reply)
    may take together this many times the session's typical reply (the median of its newest
    replies; the engine's while it has none), and never less than ``response_min_s``. Past that
    the offline processors decide: the user's words go on as typed, or as the offline rewriter
    verified them, and the trace says so. ``0``: no shared budget (each call has its own
    timeout: detection 10 s, rewriting 15 s)."""
    response_min_s: float = 1.0
    """The least the response path's memory calls get (seconds), however quick the replies."""
    tenant: str = "local"
    """Tenant used when the caller names none (single-tenant use)."""
    trace_keep: int = 1000
    """Kept traces per session (the newest exchanges); 0 = keep no trace."""
    trace_max_age_days: int = 90
    """Traces older than this many days are dropped at the session's next trace; 0 = no age limit."""
    trace_max_bytes: int = 262_144
    """Size cap of one trace's JSON, bytes; longer message texts are shortened to fit (0 = no cap)."""
    pii: PiiPolicy = "keep"
    """Personal data in what is stored: ``keep`` (as typed) or ``mask`` (phone numbers, Chinese
    resident ID numbers, bank card numbers and e-mail addresses masked, ``138****5678``, before
    the turn, its trace or anything made from it is stored; the current message still reaches
    the model as typed). ``mask`` needs the ``pii`` extra."""
    pii_tenants: Mapping[str, PiiPolicy] = field(default_factory=dict)
    """Per-tenant exceptions to ``pii`` (``{"acme": "mask"}``); env ``CONTEXTMODE_PII_TENANTS``
    as ``acme=mask,beta=keep``."""
    raw_message: bool = False
    """Send the current message with chat-template control strings (``<|im_start|>``…) whole;
    by default they are broken like those of stored text."""
    embeddings_base_url: str | None = None
    """Dense recall from your own embedder: the root (with ``/v1``) of a server speaking OpenAI's
    ``POST /v1/embeddings`` (OpenAI, Ollama, llama.cpp's server, TEI, vLLM), fused with BM25
    (`memory.recall.dense.OpenAIEmbedder`; needs the ``openai`` extra). ``None``: BM25 alone."""
    embeddings_model: str | None = None
    """The embedding model's name on that server (``text-embedding-3-small``, ``nomic-embed-text``…)."""
    embeddings_api_key: str | None = field(default=None, repr=False)
    """Its key, sent as ``Authorization: Bearer``; never shown by ``repr``."""
    prices: tuple[Price, ...] = DEFAULT_PRICES
    """Prices per model family that turn each exchange's tokens into money (its trace's
    ``usage``); ``CONTEXTMODE_PRICES``: a JSON object or the path of a JSON file
    (`contextmode.pricing`, docs/caching.md)."""

    def __post_init__(self) -> None:
        if self.mode not in ("contextual", "decoupled"):
            raise ConfigError(f"mode must be 'contextual' or 'decoupled', got {self.mode!r}")
        if self.pii not in ("keep", "mask"):
            raise ConfigError(f"pii (CONTEXTMODE_PII) must be 'keep' or 'mask', got {self.pii!r}")
        for tenant, policy in self.pii_tenants.items():
            if policy not in ("keep", "mask"):
                raise ConfigError(f"pii of tenant {tenant!r} (CONTEXTMODE_PII_TENANTS) must be 'keep' or 'mask', got {policy!r}")
        if self.response_share < 0 or self.response_min_s < 0:
            raise ConfigError("CONTEXTMODE_RESPONSE_SHARE and CONTEXTMODE_RESPONSE_MIN_S must be >= 0")
        if bool(self.embeddings_base_url) != bool(self.embeddings_model):
            raise ConfigError(
                "dense recall needs both CONTEXTMODE_EMBEDDINGS_BASE_URL and CONTEXTMODE_EMBEDDINGS_MODEL "
                "(CONTEXTMODE_EMBEDDING_MODEL, singular, is the local MiniLM directory)"
            )

    @property
    def embeddings(self) -> bool:
        """True when an embeddings server is configured (dense recall on)."""
        return bool(self.embeddings_base_url and self.embeddings_model)

    def pii_for(self, tenant: str) -> PiiPolicy:
        """The personal-data policy of ``tenant``: its own when set, else ``pii``."""
        return self.pii_tenants.get(tenant, self.pii)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> EngineSettings:
        """Settings from ``CONTEXTMODE_STRATEGY``, ``_CONTEXT_WINDOW``, ``_REPLY_RESERVE``,
        ``_MODE``, ``_ORDER``, ``_LOCALE``, ``_SUMMARY_THRESHOLD``, ``_JOB_ATTEMPTS``, ``_REWRITE``,
        ``_RESPONSE_SHARE``, ``_RESPONSE_MIN_S``,
        ``_TRACE_KEEP``, ``_TRACE_MAX_AGE_DAYS``, ``_TRACE_MAX_BYTES``, ``_PII``, ``_PII_TENANTS``, ``_RAW_MESSAGE``,
        ``_EMBEDDINGS_BASE_URL``, ``_EMBEDDINGS_MODEL``, ``_EMBEDDINGS_API_KEY``, ``_PRICES``."""
        env = os.environ if env is None else env
        reserve = env.get("CONTEXTMODE_REPLY_RESERVE")
        return cls(
            strategy=env.get("CONTEXTMODE_STRATEGY", "default"),
            context_window=env_int(env, "CONTEXTMODE_CONTEXT_WINDOW", 8192, minimum=64),
            reply_reserve=env_int(env, "CONTEXTMODE_REPLY_RESERVE", 0) if reserve else None,
            mode=env.get("CONTEXTMODE_MODE", "contextual"),  # type: ignore[arg-type]
            order=env.get("CONTEXTMODE_ORDER", "default"),
            locale=env.get("CONTEXTMODE_LOCALE", "auto"),
            summary_threshold=env_int(env, "CONTEXTMODE_SUMMARY_THRESHOLD", 10, minimum=1),
            job_attempts=env_int(env, "CONTEXTMODE_JOB_ATTEMPTS", 3, minimum=1),
            rewrite=env.get("CONTEXTMODE_REWRITE", "1").lower() not in ("0", "false", "no"),
            response_share=env_float(env, "CONTEXTMODE_RESPONSE_SHARE", 1.0),
            response_min_s=env_float(env, "CONTEXTMODE_RESPONSE_MIN_S", 1.0),
            trace_keep=env_int(env, "CONTEXTMODE_TRACE_KEEP", 1000),
            trace_max_age_days=env_int(env, "CONTEXTMODE_TRACE_MAX_AGE_DAYS", 90),
            trace_max_bytes=env_int(env, "CONTEXTMODE_TRACE_MAX_BYTES", 262_144),
            pii=env.get("CONTEXTMODE_PII", "keep").strip().lower() or "keep",  # type: ignore[arg-type]
            pii_tenants=_tenant_policies(env.get("CONTEXTMODE_PII_TENANTS", "")),
            raw_message=env_flag(env, "CONTEXTMODE_RAW_MESSAGE", False),
            embeddings_base_url=env.get("CONTEXTMODE_EMBEDDINGS_BASE_URL", "").strip() or None,
            embeddings_model=env.get("CONTEXTMODE_EMBEDDINGS_MODEL", "").strip() or None,
            embeddings_api_key=env.get("CONTEXTMODE_EMBEDDINGS_API_KEY", "").strip() or None,
            prices=load_prices(env.get("CONTEXTMODE_PRICES", "")),
        )


def _tenant_policies(raw: str) -> dict[str, PiiPolicy]:
    """``acme=mask,beta=keep`` as a mapping; `ConfigError` naming the variable when malformed."""
    out: dict[str, PiiPolicy] = {}
    for part in filter(None, (p.strip() for p in raw.split(","))):
        tenant, sep, policy = part.partition("=")
        if not sep or not tenant.strip() or policy.strip().lower() not in ("keep", "mask"):
            raise ConfigError(f"CONTEXTMODE_PII_TENANTS must be tenant=keep|mask pairs separated by commas, got {part!r}")
        out[tenant.strip()] = policy.strip().lower()  # type: ignore[assignment]
    return out
