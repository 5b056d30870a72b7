"""The harness-overhead benchmark: its sessions run and its report does the arithmetic."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ci.bench import harness_overhead

pytestmark = pytest.mark.slow


def kind(name: str) -> harness_overhead.Kind:
    return next(k for k in harness_overhead.KINDS if k.name == name)


@pytest.mark.parametrize("name", ["plain", "harness"])
def test_a_kind_times_every_test_of_its_session(tmp_path: Path, name: str) -> None:
    short = dataclasses.replace(kind(name), count=3)
    durations = harness_overhead.test_durations(
        short, 1, harness_overhead.BODIES["empty"], tmp_path
    )
    assert len(durations) == 3
    assert all(0 < d < 60 for d in durations)


def test_a_failing_body_fails_the_benchmark(tmp_path: Path) -> None:
    short = dataclasses.replace(kind("harness"), count=3)
    with pytest.raises(RuntimeError, match="harness at size 1 failed"):
        harness_overhead.test_durations(short, 1, "assert WORLD_SIZE == 2", tmp_path)


def squeezed(line: str) -> str:
    return " ".join(line.split())


def test_report_gives_ratios_per_test_and_above_the_plain_test() -> None:
    costs = {"plain": 0.001, "harness": 0.002, "spawn": 4.001, "continuous": 0.006}
    lines = [squeezed(line) for line in harness_overhead.report(4, "empty", costs)]
    assert lines[0] == "world size 4, body empty:"
    assert lines[2] == "harness 2.0 ms per test (1.0 ms above plain)"
    assert lines[-2] == "spawn / harness = 2000.5x per test, 4000.0x above plain"
    assert lines[-1] == "continuous / harness = 3.0x per test, 5.0x above plain"


def test_report_does_not_divide_by_a_harness_within_noise() -> None:
    costs = {"plain": 0.002, "harness": 0.002, "continuous": 0.006}
    assert harness_overhead.report(2, "empty", costs)[-1].endswith(
        "harness within the plain test's noise"
    )
