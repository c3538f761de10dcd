"""The PostgreSQL backend (extra ``postgres``): its driver, schema, postings, lifecycle and row decoders."""

from .driver import PostgresStore

__all__ = ["PostgresStore"]
