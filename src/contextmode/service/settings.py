"""Settings of the HTTP service, read from ``CONTEXTMODE_*`` environment variables.

| variable                          | default                        | unit / meaning                              |
|-----------------------------------|--------------------------------|---------------------------------------------|
| ``CONTEXTMODE_HOST``              | ``127.0.0.1``                  | bind address (loopback unless told)          |
| ``CONTEXTMODE_PORT``              | ``8000``                       | TCP port                                     |
| ``CONTEXTMODE_API_KEYS``          | (none)                         | ``key1:tenantA,key2:tenantB``                |
| ``CONTEXTMODE_API_KEYS_FILE``     | (none)                         | JSON or TOML file: ``{key: tenant}`` or ``keys`` table |
| ``CONTEXTMODE_MAX_IMAGES``        | ``4``                          | images per message                           |
| ``CONTEXTMODE_MAX_IMAGE_BYTES``   | ``5242880`` (5 MiB)            | decoded bytes per image                      |
| ``CONTEXTMODE_ALLOWED_IMAGE_TYPES`` | ``png,jpeg,gif,webp``        | allowed image types (checked by magic bytes) |
| ``CONTEXTMODE_MAX_MESSAGE_CHARS`` | ``32000``                      | characters per message                       |
| ``CONTEXTMODE_MAX_TOOL_RESULT_CHARS`` | ``200000``                 | characters per tool result (proxies)         |
| ``CONTEXTMODE_MAX_BODY_BYTES``    | ``33554432`` (32 MiB)          | bytes per request body                       |
| ``CONTEXTMODE_IMAGE_DIR``         | ``<tmp>/contextmode-images``   | where image temp files live while a turn runs |
| ``CONTEXTMODE_SESSION_WAIT_MS``   | ``10000``                      | wait for a session's previous turn, then 40902 |
| ``CONTEXTMODE_SESSION_LOCK_TTL_S`` | ``300``                       | a dead worker's turn lock frees its session after this |
| ``CONTEXTMODE_MAX_JSON_ITEMS``    | ``20000``                      | keys + array items per JSON body             |
| ``CONTEXTMODE_MAX_JSON_DEPTH``    | ``32``                         | nesting depth per JSON body                  |
| ``CONTEXTMODE_STREAM_FLUSH_MS``   | ``50``                         | streamed deltas are sent at most this often  |
| ``CONTEXTMODE_STREAM_FLUSH_BYTES`` | ``2048``                      | ...or once this many bytes wait              |
| ``CONTEXTMODE_SSE_PING_S``        | ``15``                         | keep-alive comment on an idle stream         |
| ``CONTEXTMODE_SSE_SEND_TIMEOUT_S`` | ``10``                        | a stream whose client stops reading this long is finished without it (0 = never) |
| ``CONTEXTMODE_FORGET_SYNC_S``     | ``1``                          | seconds between checks for sessions another worker erased (0 = off) |
| ``CONTEXTMODE_ALLOWED_HOSTS``     | loopback names (no keys), ``*`` (keys) | ``Host``/``Origin`` names served (``*`` = any; ``.example.com`` = with subdomains) |
| ``CONTEXTMODE_RETRY_WINDOW_S``   | ``600``                        | a proxied message repeating the last, unanswered one within this many seconds reuses its stored turn (0 = off) |

No key configured means one local tenant (``local``) and no authentication:
keep the service on loopback then.
"""

from __future__ import annotations

import json
import os
import tempfile
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError
from ..settings import env_int
from ..types import validate_id

__all__ = ["IMAGE_TYPES", "ServiceSettings", "api_keys_from_env", "parse_api_keys"]

IMAGE_TYPES = ("png", "jpeg", "gif", "webp")
"""Image types the boundary knows how to recognise by their magic bytes."""


def parse_api_keys(spec: str) -> dict[str, str]:
    """``"key1:tenantA,key2:tenantB"`` → ``{"key1": "tenantA", …}`` (tenants validated)."""
    keys: dict[str, str] = {}
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, tenant = part.rpartition(":")
        if not sep or not key.strip() or not tenant.strip():
            # never echo the key itself into the error
            raise ConfigError("CONTEXTMODE_API_KEYS must look like 'key1:tenantA,key2:tenantB'")
        keys[key.strip()] = validate_id(tenant.strip(), "tenant")
    return keys


def _keys_from_file(path: Path) -> dict[str, str]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read CONTEXTMODE_API_KEYS_FILE {str(path)!r}: {exc.strerror}") from exc
    try:
        data = tomllib.loads(raw.decode()) if path.suffix == ".toml" else json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"CONTEXTMODE_API_KEYS_FILE {str(path)!r} is not valid {path.suffix[1:] or 'JSON'}") from exc
    if isinstance(data, dict) and isinstance(data.get("keys"), dict):
        data = data["keys"]
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise ConfigError("CONTEXTMODE_API_KEYS_FILE must map API keys to tenant names ({key: tenant})")
    return {k: validate_id(v, "tenant") for k, v in data.items() if k}


@dataclass(frozen=True, kw_only=True)
class ServiceSettings:
    """How the HTTP service listens, authenticates and limits requests."""

    host: str = "127.0.0.1"
    """Bind address; loopback by default."""
    port: int = 8000
    """TCP port."""
    api_keys: Mapping[str, str] = field(default_factory=dict, repr=False)
    """API key → tenant. Empty: one tenant (``local_tenant``), no authentication."""
    local_tenant: str = "local"
    """The tenant every request uses when no key is configured."""
    max_images: int = 4
    """Images per message."""
    max_image_bytes: int = 5 * 1024 * 1024
    """Decoded bytes per image."""
    allowed_image_types: tuple[str, ...] = IMAGE_TYPES
    """Image types accepted (subset of `IMAGE_TYPES`), checked by magic bytes, not by the declared MIME."""
    max_message_chars: int = 32_000
    """Characters per message."""
    max_tool_result_chars: int = 200_000
    """Characters per tool result sent to a proxy (a file, a page, a command's output)."""
    max_body_bytes: int = 32 * 1024 * 1024
    """Bytes per request body (checked on ``Content-Length`` and while reading)."""
    image_dir: Path = field(default_factory=lambda: Path(tempfile.gettempdir()) / "contextmode-images")
    """Dedicated folder for image temp files; they exist only while their turn runs."""
    session_wait_ms: int = 10_000
    session_lock_ttl_s: int = 300
    """Expiry of a session's turn lock: how long a worker that died mid-turn keeps its session
    busy. Keep it above the longest turn (the reply deadline, `CONTEXTMODE_LLM_DEADLINE_S`)."""
    """How long a turn waits for the previous turn of its session before `40902` (session busy)."""
    max_json_items: int = 20_000
    """Keys plus array items per JSON body (counted before validation); more is refused with 40001."""
    max_json_depth: int = 32
    """Nesting depth per JSON body."""
    stream_flush_ms: int = 50
    """A stream sends the model's deltas at most this often (coalesced in between)."""
    stream_flush_bytes: int = 2048
    """...or as soon as this many bytes of text are waiting."""
    sse_ping_s: int = 15
    """A ``: ping`` comment line on an idle stream every this many seconds (proxies keep it open)."""
    sse_send_timeout_s: float = 10.0
    """A stream write that waits this long (the client stopped reading, its socket still open)
    ends the sending: the turn finishes without the client, its answer stored, and the session
    is free again (0 = wait as long as the socket lives)."""
    forget_sync_s: float = 1.0
    """Seconds between two reads of the deletion log, to drop this worker's copies of
    sessions another worker erased (0 = never; docs/lifecycle.md)."""
    allowed_hosts: tuple[str, ...] | None = None
    """``Host`` and browser ``Origin`` names served, against DNS rebinding (`service.hosts`);
    ``None``: loopback names without API keys, any host with them; ``("*",)``: any host."""
    retry_window_s: float = 600.0
    """A proxied message that repeats the session's last, unanswered one (its request failed)
    within this many seconds reuses its stored turn: an SDK's retries store one user turn
    (0 = always store; docs/service.md)."""

    def __post_init__(self) -> None:
        unknown = set(self.allowed_image_types) - set(IMAGE_TYPES)
        if unknown:
            raise ConfigError(f"unknown image types {sorted(unknown)}; known: {', '.join(IMAGE_TYPES)}")
        validate_id(self.local_tenant, "tenant")

    def __repr__(self) -> str:
        return (
            f"ServiceSettings(host={self.host!r}, port={self.port}, api_keys=<{len(self.api_keys)} keys>, "
            f"max_images={self.max_images}, max_image_bytes={self.max_image_bytes}, "
            f"max_message_chars={self.max_message_chars}, max_body_bytes={self.max_body_bytes}, "
            f"image_dir={str(self.image_dir)!r})"
        )

    @property
    def auth_enabled(self) -> bool:
        """True when at least one API key is configured."""
        return bool(self.api_keys)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ServiceSettings:
        """Read the settings (see the module docstring); raise `ConfigError` on bad values."""
        env = os.environ if env is None else env
        keys = api_keys_from_env(env)
        types = env.get("CONTEXTMODE_ALLOWED_IMAGE_TYPES", "").strip()
        image_dir = env.get("CONTEXTMODE_IMAGE_DIR", "").strip()
        defaults = cls()
        return cls(
            host=env.get("CONTEXTMODE_HOST", "").strip() or defaults.host,
            port=env_int(env, "CONTEXTMODE_PORT", defaults.port, 0),
            api_keys=keys,
            max_images=env_int(env, "CONTEXTMODE_MAX_IMAGES", defaults.max_images, 0),
            max_image_bytes=env_int(env, "CONTEXTMODE_MAX_IMAGE_BYTES", defaults.max_image_bytes, 1),
            allowed_image_types=tuple(
                t.strip().lower().replace("jpg", "jpeg") for t in types.split(",") if t.strip()
            )
            if types
            else IMAGE_TYPES,
            max_message_chars=env_int(env, "CONTEXTMODE_MAX_MESSAGE_CHARS", defaults.max_message_chars, 1),
            max_tool_result_chars=env_int(
                env, "CONTEXTMODE_MAX_TOOL_RESULT_CHARS", defaults.max_tool_result_chars, 1
            ),
            max_body_bytes=env_int(env, "CONTEXTMODE_MAX_BODY_BYTES", defaults.max_body_bytes, 1024),
            image_dir=Path(image_dir).expanduser() if image_dir else defaults.image_dir,
            session_wait_ms=env_int(env, "CONTEXTMODE_SESSION_WAIT_MS", defaults.session_wait_ms, 0),
            session_lock_ttl_s=env_int(env, "CONTEXTMODE_SESSION_LOCK_TTL_S", defaults.session_lock_ttl_s, 1),
            max_json_items=env_int(env, "CONTEXTMODE_MAX_JSON_ITEMS", defaults.max_json_items, 16),
            max_json_depth=env_int(env, "CONTEXTMODE_MAX_JSON_DEPTH", defaults.max_json_depth, 4),
            stream_flush_ms=env_int(env, "CONTEXTMODE_STREAM_FLUSH_MS", defaults.stream_flush_ms, 0),
            stream_flush_bytes=env_int(env, "CONTEXTMODE_STREAM_FLUSH_BYTES", defaults.stream_flush_bytes, 1),
            sse_ping_s=env_int(env, "CONTEXTMODE_SSE_PING_S", defaults.sse_ping_s, 1),
            sse_send_timeout_s=_seconds(env, "CONTEXTMODE_SSE_SEND_TIMEOUT_S", defaults.sse_send_timeout_s),
            forget_sync_s=_seconds(env, "CONTEXTMODE_FORGET_SYNC_S", defaults.forget_sync_s),
            allowed_hosts=_names(env, "CONTEXTMODE_ALLOWED_HOSTS"),
            retry_window_s=_seconds(env, "CONTEXTMODE_RETRY_WINDOW_S", defaults.retry_window_s),
        )


def api_keys_from_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """API key → tenant from ``CONTEXTMODE_API_KEYS_FILE`` and ``CONTEXTMODE_API_KEYS`` (the
    latter wins on a key in both); empty when neither is set."""
    env = os.environ if env is None else env
    keys: dict[str, str] = {}
    if file := env.get("CONTEXTMODE_API_KEYS_FILE", "").strip():
        keys.update(_keys_from_file(Path(file).expanduser()))
    if spec := env.get("CONTEXTMODE_API_KEYS", "").strip():
        keys.update(parse_api_keys(spec))
    return keys


def _names(env: Mapping[str, str], name: str) -> tuple[str, ...] | None:
    """A comma-separated list (``None`` when unset or empty)."""
    names = tuple(part.strip() for part in env.get(name, "").split(",") if part.strip())
    return names or None


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds, got {raw!r}") from None
    if value < 0:
        raise ConfigError(f"{name} must be 0 or more, got {raw!r}")
    return value
