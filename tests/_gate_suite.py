"""The inner gate suite (``inner/inner_gate.py`` with a fork's manifest) and the gate run on
it: the gate's own tests read one run of it, and the shards' tests compare theirs with it."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ci.gate.results import GateResults, TestResult
from ci.gate.target import SUITE_ROOT
from tests._inner import INNER_DIR

FORK_MANIFEST = """# a fork's own manifest
[[divergence]]
id = "known"
link = "https://example.org/k"
reason = "rank 0 is never 5"
tests = ["inner_gate.py::test_known_divergence[w2]"]

[[divergence]]
id = "fixed"
link = "https://example.org/f"
reason = "fails before 2.0"
tests = ["inner_gate.py::test_fixed_in_this_build[w2]"]

[[divergence]]
id = "stale"
link = "https://example.org/gone"
reason = "removed long ago"
tests = ["inner_gate.py::test_gone"]
"""
# The first line of the inner suite's report, by one gate run or by merged shards or jobs.
FAILED_TITLE = "# State-dict conformance gate: FAILED (4 failing test ids)"


@dataclass(frozen=True)
class GateRun:
    """One gate run of the inner suite: its exit status, output and reports."""

    suite: Path
    manifest: Path
    returncode: int
    output: str
    out: Path
    results: GateResults

    def test(self, name: str) -> TestResult:
        (found,) = [t for t in self.results.tests if t.nodeid == f"inner_gate.py::{name}"]
        return found


def run_gate(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "ci.gate", *args]
    return subprocess.run(
        command, cwd=SUITE_ROOT, capture_output=True, text=True, timeout=600, check=False
    )


def inner_suite(work: Path) -> tuple[Path, Path]:
    """The inner gate suite under ``work``, with the suite's manifest plugin as conformance/
    has it, and a fork's manifest for it."""
    suite = work / "suite"
    suite.mkdir()
    (suite / "inner_gate.py").write_text((INNER_DIR / "inner_gate.py").read_text())
    (suite / "conftest.py").write_text("pytest_plugins = ['conformance.conftest']\n")
    manifest = work / "fork-manifest.toml"
    manifest.write_text(FORK_MANIFEST)
    return suite, manifest


def gate_on_inner_suite(
    suite: Path, manifest: Path, out: Path, *gate_args: str, after: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """The gate at world sizes 1 and 2 on ``suite``; ``after``: arguments after its ``--``."""
    args = ["--world-sizes", "1,2", "--out", str(out), "--manifest", str(manifest), *gate_args]
    # The rootdir is the suite's folder wherever this runs (else the common ancestor of it
    # and the working directory, e.g. /tmp for a checkout in /tmp): node ids as in a fork.
    test_args = [str(suite / "inner_gate.py"), f"--rootdir={suite}", "-p", "no:cacheprovider"]
    return run_gate(*args, "--", *test_args, *after)


def gate_run(work: Path) -> GateRun:
    """The inner suite written under ``work`` and the gate run on it, as it is."""
    suite, manifest = inner_suite(work)
    out = work / "report"
    completed = gate_on_inner_suite(suite, manifest, out)
    output = completed.stdout + completed.stderr
    assert (out / "results.json").exists(), output
    results = GateResults.load(out / "results.json")
    return GateRun(suite, manifest, completed.returncode, output, out, results)
