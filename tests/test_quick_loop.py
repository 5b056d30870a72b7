"""Bare ``pytest`` is a contributor's quick loop: it leaves out the tests marked slow, and
``--slow`` (``tox -e unit``, ``.ci/run``) brings every one of them back."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ci.gate.target import SUITE_ROOT

pytestmark = pytest.mark.slow


def collected(*args: str) -> set[str]:
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=SUITE_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return {line for line in completed.stdout.splitlines() if "::" in line}


def test_bare_pytest_leaves_out_the_slow_tests_and_slow_brings_them_back() -> None:
    quick, everything = collected(), collected("--slow")
    assert quick < everything
    assert "tests/test_spec.py::test_gloo_cpu_world_is_available_here" in quick
    # A module marked slow as a whole, and one test marked alone in a quick module.
    faults = {nodeid for nodeid in everything if nodeid.startswith("tests/test_faults.py::")}
    assert faults
    assert not faults & quick
    resolution = "tests/test_memory_probe.py::test_a_reading_is_low_by_at_most_the_resolution"
    assert resolution in everything - quick
    assert (
        "tests/test_quick_loop.py::test_bare_pytest_leaves_out_the_slow_tests_and_slow_brings_them_back"
        in everything - quick
    )
