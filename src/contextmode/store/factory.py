"""`open_store(url)`: one URL picks and configures the backend.

| URL | backend |
|---|---|
| ``memory://`` | `MemoryStore` (one process, nothing persisted) |
| ``sqlite:///relative.db``, ``sqlite:////abs/path.db`` | `SQLiteStore` (SQLAlchemy's convention: 3 slashes + path) |
| ``postgresql://user@host:5432/db?schema=contextmode&pool_min=1&pool_max=10`` | `PostgresStore` (extra ``postgres``) |
| ``redis://host:6379/0?namespace=cm:`` | `RedisStore` (extra ``redis``) |

With no URL: ``CONTEXTMODE_STORE_URL``, else the SQLite file
``$CONTEXTMODE_HOME/contextmode.db`` (``~/.contextmode/contextmode.db``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlencode

from ..errors import ConfigError
from .base import Store
from .memory import MemoryStore

__all__ = ["StoreSettings", "default_store_url", "open_store"]


@dataclass(frozen=True, kw_only=True)
class StoreSettings:
    """Where sessions live, from ``CONTEXTMODE_*`` environment variables."""

    url: str
    """Store URL (``CONTEXTMODE_STORE_URL``); defaults to the SQLite file under the home."""
    redis_namespace: str = "cm:"
    """Prefix of every Redis key (``CONTEXTMODE_REDIS_NAMESPACE``); a URL's ``?namespace=`` wins."""
    pg_schema: str = "contextmode"
    """PostgreSQL schema of the tables (``CONTEXTMODE_PG_SCHEMA``); a URL's ``?schema=`` wins."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> StoreSettings:
        env = os.environ if env is None else env
        return cls(
            url=env.get("CONTEXTMODE_STORE_URL") or default_store_url(env),
            redis_namespace=env.get("CONTEXTMODE_REDIS_NAMESPACE", "cm:"),
            pg_schema=env.get("CONTEXTMODE_PG_SCHEMA") or "contextmode",
        )


def default_store_url(env: Mapping[str, str] | None = None) -> str:
    """``sqlite:///`` + ``$CONTEXTMODE_HOME/contextmode.db`` (home default ``~/.contextmode``)."""
    env = os.environ if env is None else env
    home = Path(env.get("CONTEXTMODE_HOME") or Path.home() / ".contextmode").expanduser()
    return f"sqlite:///{home.absolute() / 'contextmode.db'}"


def _split_option(url: str, name: str) -> tuple[str, str | None]:
    """``url`` without its ``?name=`` query parameter, and that parameter's value."""
    # Plain string surgery: urlunsplit would drop a slash of ``sqlite:////abs/path``.
    base, _, raw_query = url.partition("?")
    query = parse_qsl(raw_query, keep_blank_values=True)
    value = next((v for k, v in query if k == name), None)
    rest = urlencode([(k, v) for k, v in query if k != name])
    return (f"{base}?{rest}" if rest else base), value


def open_store(url: str | None = None, *, env: Mapping[str, str] | None = None) -> Store:
    """The store ``url`` names (see the module docstring); connects lazily on first use.

    Raises `ConfigError` for an unknown scheme or a malformed URL and
    `MissingExtra` (on first use) when the backend's driver is not installed.
    """
    settings = StoreSettings.from_env(env)
    url = url or settings.url
    scheme = url.split(":", 1)[0].lower()
    try:
        if scheme == "memory":
            return MemoryStore()
        if scheme == "sqlite":
            return _sqlite(url)
        if scheme in {"postgresql", "postgres"}:
            from .postgres import PostgresStore

            dsn, schema = _split_option(url, "schema")
            dsn, pool_min = _split_option(dsn, "pool_min")
            dsn, pool_max = _split_option(dsn, "pool_max")
            return PostgresStore(
                dsn,
                schema=schema or settings.pg_schema,
                min_size=int(pool_min) if pool_min else 1,
                max_size=int(pool_max) if pool_max else 10,
            )
        if scheme in {"redis", "rediss", "unix"}:
            from .redis import RedisStore

            redis_url, namespace = _split_option(url, "namespace")
            return RedisStore(
                redis_url, namespace=settings.redis_namespace if namespace is None else namespace
            )
    except (ValueError, ConfigError) as exc:
        raise ConfigError(f"invalid store URL {url!r} (CONTEXTMODE_STORE_URL or --store): {exc}") from exc
    raise ConfigError(
        f"unknown store URL {url!r} (CONTEXTMODE_STORE_URL or --store): "
        "use memory://, sqlite:///path, postgresql://… or redis://…"
    )


def _sqlite(url: str) -> Store:
    from .sqlite import SQLiteStore

    rest, synchronous = _split_option(url, "synchronous")
    rest, busy = _split_option(rest, "busy_timeout")
    if not rest.startswith("sqlite:///") or "?" in rest:
        raise ValueError(
            "SQLite URLs are sqlite:///relative/path or sqlite:////absolute/path"
            " (options: synchronous, busy_timeout)"
        )
    path = rest.removeprefix("sqlite:///")
    if not path:
        raise ValueError("the SQLite URL names no file")
    return SQLiteStore(
        path,
        synchronous=synchronous or "NORMAL",
        busy_timeout_s=float(busy) if busy else 30.0,
    )
