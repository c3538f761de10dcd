"""Fakes and contract suites shipped with the package, for users' tests and ours."""

from .counters import CharTokenCounter

__all__ = ["CharTokenCounter"]
