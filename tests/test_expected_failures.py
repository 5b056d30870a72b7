"""A rank's failure that pytest will report as expected is formatted cheaply, as Python does;
every other failure as pytest would. pytest keeps only an expected failure's xfail reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness._rank_pytest import format_failure
from harness._spawn_mode import WorldTicket, _request
from harness._spec import WorldSpec

MARKED = """
import pytest

def helper():
    pass

@pytest.mark.world(2)
@pytest.mark.xfail(reason="a known divergence", strict=True)
def test_unconditional(world):
    pass

@pytest.mark.world(2)
@pytest.mark.xfail(True, reason="a condition")
def test_condition_given(world):
    pass

@pytest.mark.world(2)
@pytest.mark.xfail(condition=True, reason="a condition by name")
def test_condition_by_name(world):
    pass

@pytest.mark.world(2)
@pytest.mark.xfail(raises=ValueError, reason="only this error")
def test_raises(world):
    pass

@pytest.mark.world(2)
@pytest.mark.xfail(run=False, reason="not run")
def test_not_run(world):
    pass

@pytest.mark.world(2)
def test_unmarked(world):
    pass

@pytest.mark.world(2)
class TestMarkedClass:
    pytestmark = pytest.mark.xfail(reason="the whole class")

    def test_inherits(self, world):
        pass
"""

EXPECTED = {
    "test_unconditional[w2]": True,
    "test_condition_given[w2]": False,
    "test_condition_by_name[w2]": False,
    "test_raises[w2]": False,
    "test_not_run[w2]": False,
    "test_unmarked[w2]": False,
    "test_inherits[w2]": True,
}


def _requested(pytester: pytest.Pytester, *args: str) -> dict[str, bool]:
    pytester.makepyfile(MARKED)
    items, _ = pytester.inline_genitems(*args)
    ticket = WorldTicket(WorldSpec("gloo", 2, "cpu"), pytester.path)
    requests = {item.name: _request(item, ticket, 10.0) for item in items}  # type: ignore[arg-type]
    return {name: request.failure_expected for name, request in requests.items()}


@pytest.mark.slow  # an inner collection: a second
def test_ranks_are_told_which_failures_pytest_reports_as_expected(
    pytester: pytest.Pytester,
) -> None:
    assert _requested(pytester) == EXPECTED


@pytest.mark.slow
def test_with_runxfail_no_failure_is_expected(pytester: pytest.Pytester) -> None:
    assert _requested(pytester, "--runxfail") == dict.fromkeys(EXPECTED, False)


FAILING_MODULE = """
def check(values):
    if values["lr"] != 0.1:
        raise ValueError(f"lr is {values['lr']}")

def test_body():
    check({"lr": 0.5})
"""


def _raised_in(tmp_path: Path) -> tuple[BaseException, str]:
    path = tmp_path / "failing_module.py"
    path.write_text(FAILING_MODULE)
    namespace: dict[str, Any] = {}
    exec(compile(FAILING_MODULE, str(path), "exec"), namespace)  # frames name the file
    try:
        namespace["test_body"]()
    except ValueError as exc:
        return exc, str(path)
    raise AssertionError("the failing module did not raise")


def test_an_unexpected_failure_reads_as_pytest_shows_it(
    tmp_path: Path, pytestconfig: pytest.Config
) -> None:
    exc, path = _raised_in(tmp_path)
    text = format_failure(exc, path, pytestconfig)
    assert '>       check({"lr": 0.5})' in text  # pytest's source lines with their marker
    assert "values = {'lr': 0.5}" in text  # and the function's arguments
    assert "E           ValueError: lr is 0.5" in text


def test_an_expected_failure_reads_as_python_shows_it(
    tmp_path: Path, pytestconfig: pytest.Config
) -> None:
    exc, path = _raised_in(tmp_path)
    text = format_failure(exc, path, pytestconfig, native=True)
    assert text.startswith("Traceback (most recent call last):")
    assert f'File "{path}", line 7, in test_body' in text
    assert f'File "{path}", line 4, in check' in text
    assert text.rstrip().endswith("ValueError: lr is 0.5")
    assert "E       " not in text
