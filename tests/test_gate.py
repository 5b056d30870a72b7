"""The gate entry point end to end: a small suite run through ``python -m ci.gate``, and
the results file, junit XML, reports and rerun commands it leaves."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest

from ci.gate.results import GateResults, TestResult
from ci.gate.target import SUITE_ROOT
from tests._inner import INNER_DIR

pytestmark = pytest.mark.slow

# Set by CI, where a missing browser must fail the render test rather than skip it.
REQUIRE_CHROMIUM = "GATE_REQUIRE_CHROMIUM"
# Without these, headless Chromium keeps trying to reach Google's hosts.
CHROMIUM_QUIET = (
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
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


@dataclass(frozen=True)
class GateRun:
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


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> GateRun:
    work = tmp_path_factory.mktemp("gate")
    suite, manifest = inner_suite(work)
    out = work / "report"
    completed = gate_on_inner_suite(suite, manifest, out)
    output = completed.stdout + completed.stderr
    assert (out / "results.json").exists(), output
    return GateRun(completed.returncode, output, out, GateResults.load(out / "results.json"))


def test_the_gate_fails_with_pytests_status(gate: GateRun) -> None:
    assert gate.returncode == 1, gate.output
    assert gate.results.exit_status == 1


def test_every_test_id_has_its_outcome(gate: GateRun) -> None:
    outcomes = {t.nodeid.split("::")[1]: t.outcome for t in gate.results.tests}
    assert outcomes == {
        "test_agreeing_state_dicts[w1]": "passed",
        "test_agreeing_state_dicts[w2]": "passed",
        "test_cell_that_exists_at_two_ranks_only_in_hsdp2[w1-ddp]": "passed",
        "test_cell_that_exists_at_two_ranks_only_in_hsdp2[w2-ddp]": "passed",
        "test_cell_that_exists_at_two_ranks_only_in_hsdp2[w2-hsdp2]": "passed",
        "test_rank_one_differs[w2-ddp]": "failed",
        "test_rank_one_differs[w2-fsdp2]": "failed",
        "test_cell_missing_at_this_size[w2]": "skipped",
        "test_known_divergence[w2]": "xfailed",
        "test_fixed_in_this_build[w2]": "xpassed",
        "test_plain_failure": "failed",
    }


def test_an_expected_failure_keeps_how_it_failed(gate: GateRun) -> None:
    """So that a report shows it, and recorded durations leave out a known hang's deadline."""
    test = gate.test("test_known_divergence[w2]")
    assert test.failing_ranks == (0, 1)
    assert test.first_failure.startswith("rank 0 failed: AssertionError: assert 0 == 5")
    assert not test.cut_short


def test_cells_that_do_not_exist_at_a_size_are_counted_apart_not_skipped(gate: GateRun) -> None:
    assert gate.results.not_applicable == {"hsdp2": {1: 1}}
    assert gate.results.cells()["hsdp2"] == {2: 1}
    assert gate.results.cells()["ddp"] == {1: 1, 2: 2}


def test_a_world_failure_names_the_rank_the_key_and_the_values(gate: GateRun) -> None:
    test = gate.test("test_rank_one_differs[w2-ddp]")
    assert test.failing_ranks == (1,)
    assert test.first_failure == (
        "rank 1 failed: AssertionError: fc1.weight: 1 of 2 values differ (max abs diff 1, "
        "atol=0.0, rtol=0.0); first at index (1,): got 3.0, expected 2.0"
    )
    assert (test.world_size, test.parallelism, test.check) == (2, "ddp", "inner_gate")
    assert gate.test("test_rank_one_differs[w2-fsdp2]").parallelism == "fsdp2"


def test_a_controller_failure_has_no_ranks(gate: GateRun) -> None:
    test = gate.test("test_plain_failure")
    assert test.failing_ranks == ()
    assert test.world_size is None
    assert "assert {'a': 1} == {'a': 2}" in test.first_failure


def test_skip_and_manifest_reasons_are_kept(gate: GateRun) -> None:
    assert gate.test("test_cell_missing_at_this_size[w2]").reason == (
        "this cell runs at world sizes (4,)"
    )
    assert gate.test("test_known_divergence[w2]").reason == (
        "rank 0 is never 5 (https://example.org/k)"
    )


def test_a_fixed_known_divergence_is_recorded_as_xpassed_with_its_entry(gate: GateRun) -> None:
    test = gate.test("test_fixed_in_this_build[w2]")
    assert test.first_failure == "[XPASS(strict)] fails before 2.0 (https://example.org/f)"
    assert test.rerun != ""


def test_the_execution_target_is_recorded(gate: GateRun) -> None:
    import torch

    target = gate.results.target
    assert target.torch_version == torch.__version__
    assert target.torch_git_hash == torch.version.git_version
    assert (target.backend, target.world_sizes) == ("gloo", (1, 2))
    assert target.suite_commit != ""


def test_manifests_applied_and_unused_entries_are_recorded(gate: GateRun) -> None:
    # Upstream's known divergences apply besides a fork's own.
    assert [Path(p).name for p in gate.results.manifests] == [
        "upstream.toml",
        "fork-manifest.toml",
    ]
    (unused,) = gate.results.unused_entries
    assert unused.pattern == "inner_gate.py::test_gone"
    assert unused.source.endswith("fork-manifest.toml#stale")


def test_the_release_of_the_build_is_resolved_and_reported(gate: GateRun) -> None:
    import torch

    from conformance.divergences import release_of

    release = gate.results.release
    assert release is not None
    assert release.release == str(release_of(torch.__version__))
    report = (gate.out / "report.md").read_text()
    assert f"| known divergences | {release.describe()} |" in report


def test_the_rerun_command_reruns_the_failure_alone(gate: GateRun) -> None:
    rerun = shlex.split(gate.test("test_rank_one_differs[w2-ddp]").rerun)
    assert rerun[:3] == ["python", "-m", "pytest"]
    completed = subprocess.run(
        [sys.executable, *rerun[1:]],
        cwd=SUITE_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 1, completed.stdout
    assert "1 failed in" in completed.stdout
    assert "fc1.weight: 1 of 2 values differ" in completed.stdout


def test_junit_xml_carries_the_failing_ranks(gate: GateRun) -> None:
    root = ET.parse(gate.out / "junit.xml").getroot()
    (case,) = [c for c in root.iter("testcase") if c.get("name") == "test_rank_one_differs[w2-ddp]"]
    properties = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert properties["failing_ranks"] == "1"
    assert properties["first_failure"].startswith("rank 1 failed: AssertionError: fc1.weight")


def test_the_terminal_shows_progress_and_a_summary_table(gate: GateRun) -> None:
    assert "[gate] 4/11 tests done, 1 failed, world gloo w2" in gate.output
    assert "gate summary" in gate.output
    (total,) = [line for line in gate.output.splitlines() if line.startswith("total ")]
    # Columns in OUTCOMES' order: failed, error, xpassed, passed, xfailed, skipped.
    assert total.split() == ["total", "3", "0", "1", "5", "1", "1"]


def test_the_markdown_report(gate: GateRun) -> None:
    report = (gate.out / "report.md").read_text()
    assert report.startswith("# State-dict conformance gate: FAILED (4 failing test ids)")
    assert "| ddp | ✘1 ✔2 |" in report
    assert "| hsdp2 | ✔1 |" in report
    assert "Not applicable (not collected): 1." in report
    assert "| hsdp2 | - (+1 n/a) | 1 |" in report
    assert "| ddp | 1 | 2 |" in report
    assert "| other | ✘1 XP1 ✔2 xf1 s1 |" in report
    assert "### `inner_gate.py::test_rank_one_differs[w2-ddp]`" in report
    assert "- outcome: failed; ranks: 1" in report
    assert "first at index (1,): got 3.0, expected 2.0" in report
    assert "| 1 | rank 0 is never 5 (https://example.org/k) |" in report
    assert "- matches no test: `" in report
    assert f"| torch | {gate.results.target.torch_version} (git " in report
    for size in (1, 2):  # the plots a check drew, beside the report
        assert f"![readings-w{size}](plots/readings-w{size}.png)" in report
        assert (gate.out / "plots" / f"readings-w{size}.png").stat().st_size > 1000


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get(REQUIRE_CHROMIUM):
            pytest.fail(f"{REQUIRE_CHROMIUM} is set and no chromium is on PATH")
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium)")
    return found


def _headless(chromium: str, profile: Path, *args: str) -> str:
    command = [chromium, "--headless", "--no-sandbox", "--disable-gpu", *CHROMIUM_QUIET]
    completed = subprocess.run(
        [*command, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return completed.stdout


def test_the_html_report_renders_in_headless_chromium(gate: GateRun, tmp_path: Path) -> None:
    from PIL import Image

    chromium = _chromium()
    page = (gate.out / "report.html").as_uri()
    dom = _headless(chromium, tmp_path / "profile", "--dump-dom", page)
    assert 'id="matrix"' in dom
    assert "inner_gate.py::test_rank_one_differs[w2-ddp]" in dom
    assert "assert {'a': 1} == {'a': 2}" in dom
    source = (gate.out / "report.html").read_text()
    assert "assert {&#x27;a&#x27;: 1} == {&#x27;a&#x27;: 2}" in source  # escaped, not markup
    assert '<img alt="plots/readings-w2.png" src="plots/readings-w2.png">' in source
    shot = gate.out / "report.png"
    _headless(
        chromium, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1200,2400", page
    )
    colours = {rgb for _, rgb in Image.open(shot).convert("RGB").getcolors(maxcolors=1 << 20)}
    assert (0xCF, 0x22, 0x2E) in colours  # the title, in the failed run's red
    assert (0xFF, 0xD7, 0xD5) in colours  # matrix cells with failures
