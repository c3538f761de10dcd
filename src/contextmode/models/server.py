"""What an OpenAI-compatible server says about itself: its kind, context window and tokenizer.

`probe_server` asks once, at start, with short timeouts and never raises: a
server that does not answer a probe is simply an ``openai``-kind server with
no known window. Read, in this order:

- ``GET {root}/props`` (llama.cpp's own server): ``default_generation_settings.n_ctx``;
- ``GET {base}/models``: ``max_model_len`` (vLLM), ``meta.n_ctx_train`` (llama.cpp),
  ``context_length``/``context_window`` (others); ``owned_by`` ``llamacpp`` or
  ``me`` (llama-cpp-python) marks a llama.cpp server;
- llama-cpp-python reports its window only when a prompt overflows it: one far larger than
  any local window is sent to ``/v1/completions`` and the 400's number is read;
- a tokenizer endpoint: ``POST {root}/tokenize`` (llama.cpp) or
  ``POST {base}/../extras/tokenize`` (llama-cpp-python);
- the parallel slots: ``total_slots`` in ``/props`` (llama.cpp); llama-cpp-python (no
  ``/props``, ``owned_by: me``) serves one request at a time (see `models.priority`).

The kind decides the structured-output wire format (`ResponseFormatMode`):
llama.cpp servers take ``{"type": "json_object", "schema": …}`` and refuse
``json_schema``; OpenAI and vLLM take ``{"type": "json_schema", …}``.

`ServerTokenCounter` counts with the server's own tokenizer (exact) for models
the project has no local tokenizer for; wrap it in `tokens.CachedCounter`.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from ..text.lang import is_chinese
from ..tokens.base import TokenCounter
from .settings import ResponseFormatMode, check_model_request_allowed

__all__ = ["ResponseFormatMode", "ServerInfo", "ServerTokenCounter", "probe_server", "server_root"]

logger = logging.getLogger("contextmode.models.server")

ServerKind = Literal["openai", "llamacpp"]


@dataclass(frozen=True, kw_only=True)
class ServerInfo:
    """What the probes found."""

    kind: ServerKind = "openai"
    """``llamacpp`` for llama.cpp's server and llama-cpp-python's, else ``openai``."""
    context_window: int | None = None
    """Tokens per request the server accepts, when it says."""
    window_source: str | None = None
    """Where ``context_window`` was read (``/props n_ctx``, ``/v1/models max_model_len``…)."""
    tokenize_url: str | None = None
    """An endpoint counting tokens with the served model's own tokenizer, if any."""
    slots: int | None = None
    """Requests the server answers at once, when known: llama.cpp's ``/props total_slots``;
    1 for llama-cpp-python (it serves one request at a time). ``None`` = no known limit."""
    stalls_on_broken_text: bool = False
    """llama-cpp-python: once a model writes bytes that do not decode as UTF-8, its stream sends
    nothing more until the reply ends, and each later token costs it time that grows with their
    number (it tries every prefix of them; its issue 372). A closed stream goes unnoticed
    meanwhile. Text calls in a script of multi-byte characters ask it for valid UTF-8
    (`models.openai.VALID_TEXT`)."""

    @property
    def response_format(self) -> Literal["json_schema", "json_object"]:
        """The structured-output form this kind of server takes."""
        return "json_object" if self.kind == "llamacpp" else "json_schema"


def server_root(base_url: str) -> str:
    """``http://host:port/v1`` → ``http://host:port`` (the llama.cpp native endpoints live there)."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _window_from_models(body: object, model: str | None) -> tuple[int | None, str | None, str | None]:
    """(window, source, ``owned_by``) from a ``/v1/models`` body."""
    entries = body.get("data") if isinstance(body, dict) else None
    if not isinstance(entries, list):
        return None, None, None
    chosen = [e for e in entries if isinstance(e, dict) and e.get("id") == model] or [
        e for e in entries if isinstance(e, dict)
    ]
    if not chosen:
        return None, None, None
    entry = chosen[0]
    owner = entry.get("owned_by")
    owner = owner if isinstance(owner, str) else None
    raw_meta = entry.get("meta")
    meta: dict[str, object] = raw_meta if isinstance(raw_meta, dict) else {}
    for key, where in (("max_model_len", entry), ("context_length", entry), ("context_window", entry),
                       ("n_ctx", meta), ("n_ctx_train", meta)):
        if (value := _int(where.get(key))) is not None:
            return value, f"/v1/models {key}", owner
    return None, None, owner


def probe_server(
    base_url: str | None,
    model: str | None,
    *,
    headers: Mapping[str, str] | None = None,
    timeout: float = 3.0,
) -> ServerInfo:
    """Ask the server at ``base_url`` what it is (see the module docstring); never raises."""
    if not base_url:
        return ServerInfo()  # api.openai.com: json_schema, windows by model name
    try:
        check_model_request_allowed(base_url)
        import httpx
    except Exception:  # disabled requests or no httpx: nothing to learn
        return ServerInfo()
    root, base = server_root(base_url), base_url.rstrip("/")
    kind: ServerKind = "openai"
    window, source, tokenize, slots, stalls = None, None, None, None, False
    try:
        with httpx.Client(timeout=timeout, headers=dict(headers or {})) as client:
            props = _get_json(client, f"{root}/props")
            if isinstance(props, dict) and ("default_generation_settings" in props or "n_ctx" in props):
                kind, tokenize = "llamacpp", f"{root}/tokenize"
                window, slots = _from_props(props)
                source = "/props n_ctx" if window is not None else None
            models_window, models_source, owner = _window_from_models(_get_json(client, f"{base}/models"), model)
            owned = owner in ("llamacpp", "me")
            if owned:
                kind = "llamacpp"
            if window is None and models_window is not None:
                window, source = models_window, models_source
            if owner == "me":  # llama-cpp-python
                slots = 1 if slots is None else slots  # one request at a time, under one lock
                stalls = True
            if tokenize is None and owned and _tokenizes(client, f"{root}/extras/tokenize", model):
                tokenize = f"{root}/extras/tokenize"
            if window is None and owned:
                window = _window_from_overflow(client, base, model)
                source = "context_length_exceeded" if window else None
    except Exception as exc:  # a probe is advice; the configured values stand
        logger.info("probing %s failed: %s", root, type(exc).__name__)
    return ServerInfo(kind=kind, context_window=window, window_source=source, tokenize_url=tokenize, slots=slots,
                      stalls_on_broken_text=stalls)


def _from_props(props: dict[str, object]) -> tuple[int | None, int | None]:
    """(window, slots) from llama.cpp's ``GET /props``: ``n_ctx`` and ``total_slots``."""
    settings = props.get("default_generation_settings")
    n_ctx = _int(settings.get("n_ctx")) if isinstance(settings, dict) else _int(props.get("n_ctx"))
    return n_ctx, _int(props.get("total_slots"))


_OVERFLOW_WORDS = 262_144
_MAX_CONTEXT = re.compile(r"maximum context length is (\d+) tokens|context window of (\d+)")


def _window_from_overflow(client: object, base: str, model: str | None) -> int | None:
    """llama-cpp-python reports its ``n_ctx`` nowhere but in the error for a prompt that does not
    fit: send one far larger than any local window (refused after tokenizing, before any
    evaluation) and read the number from the 400."""
    import httpx

    assert isinstance(client, httpx.Client)
    try:
        response = client.post(f"{base}/completions",
                               json={"model": model, "prompt": "a " * _OVERFLOW_WORDS, "max_tokens": 1})
    except httpx.HTTPError:
        return None
    if response.status_code != 400:
        return None
    found = _MAX_CONTEXT.search(response.text)
    return int(found.group(1) or found.group(2)) if found else None


def _get_json(client: object, url: str) -> object:
    import httpx

    assert isinstance(client, httpx.Client)
    try:
        response = client.get(url)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    try:
        return response.json()
    except ValueError:
        return None


def _tokenizes(client: object, url: str, model: str | None) -> bool:
    import httpx

    assert isinstance(client, httpx.Client)
    try:
        response = client.post(url, json={"input": "hi", "model": model})
        return response.status_code == 200 and isinstance(response.json().get("tokens"), list)
    except (httpx.HTTPError, ValueError, AttributeError):
        return False


class ServerTokenCounter:
    """A `TokenCounter` asking the server's tokenizer endpoint (exact for the served model).

    Synchronous (counting happens while a turn is assembled); a loopback call takes about a
    millisecond, and exact counts are kept in an LRU cache of ``cache_size`` texts. A server busy
    generating may not answer in time (llama-cpp-python tokenizes under the same lock as
    generation): then ``fallback`` counts for ``pause_s`` seconds, ``exact`` is False
    meanwhile (each context reports it), and the server is asked again after that.

    The fallback is calibrated against the server: every exact count is compared with the
    fallback's count of the same text, separately for Chinese and other text, and a fallback
    count is scaled by the largest ratio seen (never below 1). An estimate fitted to other
    tokenizers can count a small model's Chinese at half its real size; scaled, a context
    counted while the server is busy still fits the window.
    """

    calibration_min_tokens = 4
    """Texts shorter than this (by the fallback) say too little about the ratio to count."""

    message_overhead = 4
    """ChatML (SmolLM2, Qwen): ``<|im_start|>role\\n`` … ``<|im_end|>\\n``."""
    reply_overhead = 3

    def __init__(
        self, url: str, *, fallback: TokenCounter, model: str | None = None, timeout: float = 1.0,
        pause_s: float = 60.0, cache_size: int = 4096,
    ) -> None:
        import httpx

        self.url, self.model, self.fallback, self.pause_s = url, model, fallback, pause_s
        self.name = f"server:{model or 'model'}"
        self._llamacpp_native = not url.endswith("/extras/tokenize")
        self._client = httpx.Client(timeout=timeout)
        self._paused_until = 0.0
        self.exact = True
        """False while the fallback counts (the server did not answer in time)."""
        self._cache: OrderedDict[str, int] = OrderedDict()
        self._cache_size = cache_size
        self._ratio = {True: 1.0, False: 1.0}
        """Largest server/fallback count ratio seen, for Chinese (True) and other text."""

    def fallback_ratio(self, text: str) -> float:
        """What a fallback count of ``text`` is multiplied by (1.0 until the server was seen)."""
        return self._ratio[is_chinese(text)]

    def _estimate(self, text: str) -> int:
        return math.ceil(self.fallback.count(text) * self.fallback_ratio(text))

    def _calibrate(self, text: str, exact: int) -> None:
        estimate = self.fallback.count(text)
        if estimate >= self.calibration_min_tokens:
            chinese = is_chinese(text)
            self._ratio[chinese] = max(self._ratio[chinese], exact / estimate)

    def count(self, text: str) -> int:
        if not text:
            return 0
        if (cached := self._cache.get(text)) is not None:
            self._cache.move_to_end(text)
            return cached
        if not self.exact:
            if time.monotonic() < self._paused_until:
                return self._estimate(text)
            self.exact = True
        body: dict[str, object] = (
            {"content": text, "add_special": False} if self._llamacpp_native else {"input": text, "model": self.model}
        )
        try:
            response = self._client.post(self.url, json=body)
            response.raise_for_status()
            tokens = response.json()["tokens"]
            if not isinstance(tokens, list):
                raise TypeError("no token list")
        except Exception as exc:
            self._paused_until, self.exact = time.monotonic() + self.pause_s, False
            logger.warning("the server's tokenizer at %s failed (%s); counting with %s for %.0f s",
                           self.url, type(exc).__name__, self.fallback.name, self.pause_s)
            return self._estimate(text)
        self._calibrate(text, len(tokens))
        self._cache[text] = len(tokens)
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return len(tokens)

    def close(self) -> None:
        self._client.close()

    def __repr__(self) -> str:
        return f"ServerTokenCounter({self.url!r})"
