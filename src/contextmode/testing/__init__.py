"""Fakes and contract suites shipped with the package, for users' tests and ours."""

from typing import TYPE_CHECKING, Any

from .counters import CharTokenCounter
from .models import BrokenStream, FunctionModel, ModelCall, ScriptedModel

if TYPE_CHECKING:
    from .stub_server import StubOptions, StubServer

__all__ = [
    "BrokenStream",
    "CharTokenCounter",
    "FunctionModel",
    "ModelCall",
    "ScriptedModel",
    "StubOptions",
    "StubServer",
]


def __getattr__(name: str) -> Any:
    # Imported on first use so `python -m contextmode.testing.stub_server` does not find
    # the module already half-imported by this package.
    if name in ("StubServer", "StubOptions"):
        from . import stub_server

        return getattr(stub_server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
