"""Under a truthy CI a skip of a required component fails; locally it still skips."""

from __future__ import annotations

import pytest

from contextmode.testing.ci import ci_required

_MODULE_SKIP = """
import pytest
pytest.importorskip("contextmode_no_such_module")

def test_never_runs():
    pass
"""

_TEST_SKIP = """
import pytest

def test_inner_importorskip():
    pytest.importorskip("contextmode_no_such_module")

def test_plain_skip():
    pytest.skip("the server is not reachable")

@pytest.mark.xfail(reason="known")
def test_xfail_is_not_a_skip():
    assert False

def test_passes():
    pass
"""


def _run(pytester: pytest.Pytester, ci: str | None) -> pytest.RunResult:
    if ci is None:
        pytester._monkeypatch.delenv("CI", raising=False)
    else:
        pytester._monkeypatch.setenv("CI", ci)
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(test_module_skip=_MODULE_SKIP, test_test_skip=_TEST_SKIP)
    return pytester.runpytest_inprocess(
        "-p", "contextmode.testing.ci", "-p", "no:randomly", "--continue-on-collection-errors"
    )


@pytest.mark.parametrize("value", ["1", "TRUE", "yes", " true "])
def test_truthy_ci_turns_every_skip_into_a_failure(pytester: pytest.Pytester, value: str) -> None:
    result = _run(pytester, value)
    result.assert_outcomes(passed=1, failed=2, errors=1, xfailed=1)
    result.stdout.fnmatch_lines(["*contextmode_no_such_module*"])
    result.stdout.fnmatch_lines(["*every component is required*"])


@pytest.mark.parametrize("value", [None, "0", "false"])
def test_without_ci_skips_stay_skips(pytester: pytest.Pytester, value: str | None) -> None:
    result = _run(pytester, value)
    result.assert_outcomes(passed=1, skipped=3, xfailed=1)


def test_ci_required_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for value, expected in [("yes", True), ("1", True), ("True", True), ("0", False), ("", False)]:
        monkeypatch.setenv("CI", value)
        assert ci_required() is expected
    monkeypatch.delenv("CI")
    assert ci_required() is False
