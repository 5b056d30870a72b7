"""The gate's verdicts do not depend on the machine: its checks that compare against a record
(golden sets) or a calibrated bound (peak memory) run green on another machine's kernels and
threads. ``ATEN_CPU_CAPABILITY=default`` makes this CPU run other kernels than its own, and
two intra-op threads per rank split reductions otherwise, as another runner would: a check
that assumed bits computed elsewhere would fail here, in CI, before a user's runner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ci.gate.results import GateResults
from ci.gate.target import SUITE_ROOT
from harness.machine import this_machine

pytestmark = pytest.mark.slow

ANOTHER_MACHINE = {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "2"}
# Every golden load and step at one rank (each recorded release, each reader); the memory
# bounds of one cell of each sharding family at two ranks.
SELECTION = (
    "(golden and w1) or (peak_memory and w2 and (fsdp2 or fsdp1_full_shard_orig or tp or ddp))"
)


@pytest.mark.skipif(
    this_machine().capability == "DEFAULT",
    reason="this CPU runs ATen's default kernels already: nothing stands in for another CPU",
)
def test_records_and_bounds_hold_on_another_machine(tmp_path: Path) -> None:
    out = tmp_path / "gate"
    command = [sys.executable, "-m", "ci.gate", "--world-backend", "gloo", "--world-sizes", "1,2"]
    command += ["--jobs", "2", "--out", str(out), "--"]
    command += [
        "conformance/checks/test_golden_checkpoints.py",
        "conformance/checks/test_peak_memory.py",
    ]
    command += ["-k", SELECTION]
    completed = subprocess.run(
        command,
        cwd=SUITE_ROOT,
        env=os.environ | ANOTHER_MACHINE,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    output = completed.stdout[-6000:] + completed.stderr[-3000:]
    results = GateResults.load(out / "results.json")
    (machine,) = results.target.machines
    assert (machine.capability, machine.intra_op_threads) == ("DEFAULT", 2), output
    ran = {test.nodeid.split("::")[0] for test in results.tests if test.outcome == "passed"}
    assert ran == {
        "conformance/checks/test_golden_checkpoints.py",
        "conformance/checks/test_peak_memory.py",
    }
    steps = [test for test in results.tests if "steps_continue_as_recorded" in test.nodeid]
    assert [test.outcome for test in steps if test.outcome == "passed"], "no trajectory held"
    assert completed.returncode == 0, output
