"""The Redis backend (extra ``redis``): its driver, Lua scripts, postings, lifecycle and row decoders."""

from .driver import RedisStore

__all__ = ["RedisStore"]
