"""The Redis backend (extra ``redis``): `RedisStore` over `RedisDriver`, with its Lua scripts,
postings, lifecycle and row decoders."""

from ..front import IndexedFront
from .driver import RedisDriver

__all__ = ["RedisDriver", "RedisStore"]


class RedisStore(IndexedFront[RedisDriver]):
    """A `Store` in Redis; every key starts with ``namespace``."""

    def __init__(self, url: str, *, namespace: str = "cm:") -> None:
        super().__init__(RedisDriver(url, namespace=namespace))
        self.url, self.namespace = url, namespace
