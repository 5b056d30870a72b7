"""The oracle-speed benchmark: a real run in a world of two ranks, at a small size."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from ci.bench.oracle_cases import OPERATIONS, OracleCase, cases
from ci.gate.target import SUITE_ROOT

pytestmark = pytest.mark.slow


def test_cases_cover_every_operation_in_both_layouts() -> None:
    found = cases((64, 512))
    assert {case.op for case in found} == set(OPERATIONS)
    assert len(found) == len(OPERATIONS) * 2 * 2
    assert OracleCase("copy", 64, "many").implementations == ("torch", "oracle", "plain_copy")
    assert OracleCase("gather", 64, "few").implementations == ("torch", "oracle")


@pytest.mark.parametrize(
    ("op", "size", "layout", "message"),
    [
        ("unpad", 64, "many", "unknown operation 'unpad'"),
        ("copy", 0, "many", "copy: size must be at least 1 MiB"),
        ("copy", 64, "some", "copy: layout must be one of"),
    ],
)
def test_bad_cases_are_refused(op: str, size: int, layout: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        OracleCase(op, size, layout)


def test_a_run_times_every_implementation_and_prints_the_ratios_of_its_medians(
    tmp_path: Path,
) -> None:
    raw = tmp_path / "oracle.json"
    command = [sys.executable, "-m", "pytest", "ci/bench/benchmarks/test_oracle_speed.py", "-q"]
    command += ["-p", "no:cacheprovider", "--oracle-sizes-mib=1", "--bench-rounds=2"]
    completed = subprocess.run(
        [*command, f"--benchmark-json={raw}"],
        cwd=SUITE_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output
    benchmarks = json.loads(raw.read_text())["benchmarks"]
    medians = {
        (b["extra_info"]["op"], b["extra_info"]["layout"], b["extra_info"]["implementation"]): (
            statistics.median(b["stats"]["data"])
        )
        for b in benchmarks
    }
    expected = {
        (case.op, case.layout, impl) for case in cases((1,)) for impl in case.implementations
    }
    assert set(medians) == expected
    assert {b["extra_info"]["world_size"] for b in benchmarks} == {2}
    assert {b["stats"]["rounds"] for b in benchmarks} == {2}
    for case in cases((1,)):
        line = re.search(rf"^{case.name} +w2 .*oracle/torch +([0-9.]+).*$", output, re.MULTILINE)
        assert line is not None, output
        ratio = medians[case.op, case.layout, "oracle"] / medians[case.op, case.layout, "torch"]
        assert float(line.group(1)) == pytest.approx(ratio, abs=0.006)
        assert ("vs plain copy_" in line.group(0)) == (case.op in ("copy", "offload"))
