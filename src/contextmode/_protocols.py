"""Cheap checks of an optional ability (a ``runtime_checkable`` Protocol), the one home of them.

``isinstance(obj, SomeProtocol)`` walks the Protocol's members on every call (tens of
microseconds on Python 3.11), and the engine asks a few such questions each turn (does the
store keep the recall index, trace records, turn locks…). `implements` answers the same
question once per (class, Protocol) and then from a dictionary: a fraction of a microsecond.

The assumption: whether an object has a Protocol's members depends on its class alone. It
holds for every class of this project and for the usual Python class, whose methods and
class attributes are the same for all its instances, and whose data members are set
alike by its ``__init__`` (``EnglishOnly.english_only`` is a class attribute an instance
may change the value of, never remove). It would not hold for an object given a method of
its own after it was made (``obj.observe = f`` on one instance only), one that blocks a
method by setting it to ``None`` on some instances, or a proxy whose ``__getattr__``
answers per instance: check those with ``isinstance`` itself.

The ground floor: imports nothing of the project.
"""

from __future__ import annotations

__all__ = ["implements"]

_KNOWN: dict[tuple[type, type], bool] = {}
"""(class, Protocol) → whether its instances implement the Protocol."""


def implements(obj: object, protocol: type) -> bool:
    """``isinstance(obj, protocol)`` for a ``runtime_checkable`` ``protocol``, decided on the
    first object of each class and remembered for the class (see the module docstring)."""
    key = (type(obj), protocol)
    known = _KNOWN.get(key)
    if known is None:
        known = _KNOWN[key] = isinstance(obj, protocol)
    return known
