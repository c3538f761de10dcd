"""Under CI nothing is skipped silently: a pytest plugin that turns every skip into a failure.

Locally a test may skip when an optional component (an extra, a server, a browser) is absent.
In CI every component is required, so when ``CI`` is truthy (``1``, ``true``, ``yes``, any
case) a skipped module (``pytest.importorskip`` at import time) or a skipped test
(``pytest.skip``, ``importorskip`` inside a test) is reported as failed, naming the reason.

Enable it from a ``conftest.py``::

    pytest_plugins = ["contextmode.testing.ci"]
"""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

__all__ = ["ci_required", "skip_or_fail"]

_TRUTHY = frozenset({"1", "true", "yes"})


def ci_required() -> bool:
    """Whether ``CI`` is truthy, i.e. every optional component must be present."""
    return os.environ.get("CI", "").strip().lower() in _TRUTHY


def skip_or_fail(reason: str) -> None:
    """Skip locally; fail under a truthy ``CI`` (`ci_required`), where every component must be present."""
    if ci_required():
        pytest.fail(f"{reason} (CI is set: services are required)")
    pytest.skip(reason)


def _reason(longrepr: object) -> str:
    # A skip's longrepr is (path, lineno, "Skipped: reason"); anything else is printed as is.
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        path, lineno, message = longrepr
        return f"{path}:{lineno}: {message}"
    return str(longrepr)


def _fail(report: pytest.CollectReport | pytest.TestReport) -> None:
    report.outcome = "failed"
    report.longrepr = (
        f"{_reason(report.longrepr)}\n"
        f"CI={os.environ.get('CI', '')!r}: every component is required, so this skip fails"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, None]:
    outcome = yield
    report = outcome.get_result()
    if report.skipped and ci_required():
        _fail(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail") and ci_required():
        _fail(report)
