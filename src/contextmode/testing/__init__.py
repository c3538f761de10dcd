"""Fakes and contract suites shipped with the package, for users' tests and ours."""

from .counters import CharTokenCounter
from .models import BrokenStream, FunctionModel, ModelCall, ScriptedModel
from .stub_server import StubServer

__all__ = [
    "BrokenStream",
    "CharTokenCounter",
    "FunctionModel",
    "ModelCall",
    "ScriptedModel",
    "StubServer",
]
