"""`_protocols.implements`: the optional-ability check every `TypeGuard` uses, decided once per
(class, Protocol); the project's own seams answer as ``isinstance`` does."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol, runtime_checkable

import pytest

from contextmode._protocols import implements
from contextmode.engine import Processors
from contextmode.engine.seams import caches_sessions, indexes_turns, recall_limit
from contextmode.jobs import JobRunner, takes_hooks
from contextmode.memory.recall import Recaller
from contextmode.memory.strategies import get_strategy
from contextmode.processors.base import extracts_alone, fits_a_window, scores_in_context
from contextmode.store import MemoryStore
from contextmode.store.base import counts_job_batches, keeps_idempotency, keeps_traces
from contextmode.store.lifecycle import is_lifecycle_store
from contextmode.store.postings import has_postings, reads_turns_at
from tests.project.test_layers import graph


@runtime_checkable
class _Observes(Protocol):
    def observe(self) -> None: ...


class _Yes:
    def observe(self) -> None:
        return None


class _No:
    pass


def test_implements_answers_as_isinstance_and_remembers_the_class() -> None:
    assert implements(_Yes(), _Observes) and isinstance(_Yes(), _Observes)
    assert not implements(_No(), _Observes) and not isinstance(_No(), _Observes)
    # Decided per class: an instance given the method afterwards is not looked at again
    # (the documented assumption; no class of the project does this).
    odd = _No()
    odd.observe = lambda: None  # type: ignore[attr-defined]
    assert isinstance(odd, _Observes) and not implements(odd, _Observes)


def test_the_ground_floor_imports_nothing_of_the_project() -> None:
    assert graph().find_modules_directly_imported_by("contextmode._protocols") == set()


@pytest.mark.parametrize("check", [
    has_postings, reads_turns_at, keeps_traces, counts_job_batches, keeps_idempotency, is_lifecycle_store,
])
async def test_the_store_abilities_agree_with_isinstance(check: Callable[[object], bool], tmp_path: Path) -> None:
    from contextmode.store.factory import open_store

    # Every shipped backend, twice: the second object of a class is answered from the cache.
    # (Made without connecting: the abilities are the class's.)
    stores = [open_store(url) for url in (
        "memory://", f"sqlite:///{tmp_path / 'a.db'}", "postgresql://u@127.0.0.1:1/db?schema=x",
        "redis://127.0.0.1:1/0?namespace=x:",
    ) for _ in range(2)]
    try:
        for store in stores:
            assert check(store) == _by_isinstance(check, store)
    finally:
        for store in stores:
            await store.close()


def _by_isinstance(check: Callable[[object], bool], obj: object) -> bool:
    """What ``check`` answered before it went through `implements`: ``isinstance`` against the
    Protocol it names in its return annotation."""
    import typing

    hints = typing.get_type_hints(check)
    protocol = typing.get_args(hints["return"])[0]
    if check is is_lifecycle_store:  # it checks the four abilities (`Lifecycle`), not `LifecycleStore`
        from contextmode.store.lifecycle import Lifecycle

        protocol = Lifecycle
    return isinstance(obj, protocol)


def test_the_engines_seams_agree_with_isinstance() -> None:
    processors = Processors.offline()
    pairs: list[tuple[Callable[[object], bool], object]] = [
        (indexes_turns, Recaller()), (caches_sessions, Recaller()), (indexes_turns, None),
        (fits_a_window, processors.summarizer), (extracts_alone, processors.extractor),
        (scores_in_context, processors.emotion), (takes_hooks, JobRunner(MemoryStore())),
    ]
    for check, obj in pairs:
        assert check(obj) == _by_isinstance(check, obj)
    assert extracts_alone(processors.extractor) and scores_in_context(processors.emotion)
    assert recall_limit(get_strategy("default")) > 0 and recall_limit(get_strategy("window")) == 0
