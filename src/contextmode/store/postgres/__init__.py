"""The PostgreSQL backend (extra ``postgres``): `PostgresStore` over `PostgresDriver`, with its
schema migrations, postings, lifecycle and row decoders."""

from ..front import BatchingFront
from .driver import PostgresDriver

__all__ = ["PostgresDriver", "PostgresStore"]


class PostgresStore(BatchingFront[PostgresDriver]):
    """A `Store` in PostgreSQL; ``schema`` names the schema holding its tables."""

    def __init__(
        self, dsn: str, *, schema: str = "contextmode", min_size: int = 1, max_size: int = 10
    ) -> None:
        super().__init__(PostgresDriver(dsn, schema=schema, min_size=min_size, max_size=max_size))
        self.dsn, self.schema = dsn, schema
