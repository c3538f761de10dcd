"""Which database driver exceptions are store failures: one table per driver, in one place.

A row's class and its subclasses become `StoreError`; anything else a driver call
raises is re-raised unchanged (a bug to see, not an outage to report). The tables
are built on first use, so a driver that is not installed is never imported.
"""

from __future__ import annotations

from functools import cache

from ..errors import ErrorTable, StoreError, StoreRefused

__all__ = ["asyncpg_errors", "redis_errors"]


@cache
def asyncpg_errors() -> ErrorTable:
    """asyncpg's server errors and warnings, client and protocol errors, and socket errors."""
    import asyncpg.exceptions as pg
    from asyncpg.pgproto.pgproto import BufferError as ProtocolBufferError

    return (
        # The data itself is refused (NUL in text, a bad encoding, a value or index row too
        # big): the same request fails every time, so it is not reported as "try again".
        (pg.DataError, StoreRefused),
        (pg.ProgramLimitExceededError, StoreRefused),
        (pg.PostgresError, StoreError),  # every error the server reports
        (pg.PostgresWarning, StoreError),
        (pg.InterfaceError, StoreError),  # the client: closed connection, bad arguments, …
        (pg.InternalClientError, StoreError),
        (ProtocolBufferError, StoreError),  # an undecodable message from the server
        (OSError, StoreError),  # refused, reset, timed out
    )


@cache
def redis_errors() -> ErrorTable:
    """redis-py's errors (connection, timeout, response, script, …) and socket errors."""
    import redis.exceptions as rd

    return (
        (rd.RedisError, StoreError),
        (rd.RedisClusterException, StoreError),
        (OSError, StoreError),
    )
