"""The gate entry point end to end: a small suite run through ``python -m ci.gate``, and
the results file, junit XML, reports and rerun commands it leaves."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from ci.gate.target import SUITE_ROOT
from tests._gate_suite import FAILED_TITLE, GateRun

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


def test_the_gate_fails_with_pytests_status(inner_gate_run: GateRun) -> None:
    assert inner_gate_run.returncode == 1, inner_gate_run.output
    assert inner_gate_run.results.exit_status == 1


def test_every_test_id_has_its_outcome(inner_gate_run: GateRun) -> None:
    outcomes = {t.nodeid.split("::")[1]: t.outcome for t in inner_gate_run.results.tests}
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


def test_an_expected_failure_keeps_how_it_failed(inner_gate_run: GateRun) -> None:
    """So that a report shows it, and recorded durations leave out a known hang's deadline."""
    test = inner_gate_run.test("test_known_divergence[w2]")
    assert test.failing_ranks == (0, 1)
    assert test.first_failure.startswith("rank 0 failed: AssertionError: assert 0 == 5")
    assert not test.cut_short


def test_cells_that_do_not_exist_at_a_size_are_counted_apart_not_skipped(
    inner_gate_run: GateRun,
) -> None:
    assert inner_gate_run.results.not_applicable == {"hsdp2": {1: 1}}
    assert inner_gate_run.results.cells()["hsdp2"] == {2: 1}
    assert inner_gate_run.results.cells()["ddp"] == {1: 1, 2: 2}


def test_a_world_failure_names_the_rank_the_key_and_the_values(inner_gate_run: GateRun) -> None:
    test = inner_gate_run.test("test_rank_one_differs[w2-ddp]")
    assert test.failing_ranks == (1,)
    assert test.first_failure == (
        "rank 1 failed: AssertionError: fc1.weight: 1 of 2 values differ (max abs diff 1, "
        "atol=0.0, rtol=0.0); first at index (1,): got 3.0, expected 2.0"
    )
    assert (test.world_size, test.parallelism, test.check) == (2, "ddp", "inner_gate")
    assert inner_gate_run.test("test_rank_one_differs[w2-fsdp2]").parallelism == "fsdp2"


def test_a_controller_failure_has_no_ranks(inner_gate_run: GateRun) -> None:
    test = inner_gate_run.test("test_plain_failure")
    assert test.failing_ranks == ()
    assert test.world_size is None
    assert "assert {'a': 1} == {'a': 2}" in test.first_failure


def test_skip_and_manifest_reasons_are_kept(inner_gate_run: GateRun) -> None:
    assert inner_gate_run.test("test_cell_missing_at_this_size[w2]").reason == (
        "this cell runs at world sizes (4,)"
    )
    assert inner_gate_run.test("test_known_divergence[w2]").reason == (
        "rank 0 is never 5 (https://example.org/k)"
    )


def test_a_fixed_known_divergence_is_recorded_as_xpassed_with_its_entry(
    inner_gate_run: GateRun,
) -> None:
    test = inner_gate_run.test("test_fixed_in_this_build[w2]")
    assert test.first_failure == "[XPASS(strict)] fails before 2.0 (https://example.org/f)"
    assert test.rerun != ""


def test_the_execution_target_is_recorded(inner_gate_run: GateRun) -> None:
    import torch

    target = inner_gate_run.results.target
    assert target.torch_version == torch.__version__
    assert target.torch_git_hash == torch.version.git_version
    assert (target.backend, target.world_sizes) == ("gloo", (1, 2))
    assert target.suite_commit != ""


def test_manifests_applied_and_unused_entries_are_recorded(inner_gate_run: GateRun) -> None:
    # Upstream's known divergences apply besides a fork's own.
    assert [Path(p).name for p in inner_gate_run.results.manifests] == [
        "upstream.toml",
        "fork-manifest.toml",
    ]
    (unused,) = inner_gate_run.results.unused_entries
    assert unused.pattern == "inner_gate.py::test_gone"
    assert unused.source.endswith("fork-manifest.toml#stale")


def test_the_release_of_the_build_is_resolved_and_reported(inner_gate_run: GateRun) -> None:
    import torch

    from conformance.divergences import release_of

    release = inner_gate_run.results.release
    assert release is not None
    assert release.release == str(release_of(torch.__version__))
    report = (inner_gate_run.out / "report.md").read_text()
    assert f"| known divergences | {release.describe()} |" in report


def test_the_rerun_command_reruns_the_failure_alone(inner_gate_run: GateRun) -> None:
    rerun = shlex.split(inner_gate_run.test("test_rank_one_differs[w2-ddp]").rerun)
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


def test_junit_xml_carries_the_failing_ranks(inner_gate_run: GateRun) -> None:
    root = ET.parse(inner_gate_run.out / "junit.xml").getroot()
    (case,) = [c for c in root.iter("testcase") if c.get("name") == "test_rank_one_differs[w2-ddp]"]
    properties = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert properties["failing_ranks"] == "1"
    assert properties["first_failure"].startswith("rank 1 failed: AssertionError: fc1.weight")


def test_the_terminal_shows_progress_and_a_summary_table(inner_gate_run: GateRun) -> None:
    assert "[gate] 4/11 tests done, 1 failed, world gloo w2" in inner_gate_run.output
    assert "gate summary" in inner_gate_run.output
    (total,) = [line for line in inner_gate_run.output.splitlines() if line.startswith("total ")]
    # Columns in OUTCOMES' order: failed, error, xpassed, passed, xfailed, skipped.
    assert total.split() == ["total", "3", "0", "1", "5", "1", "1"]


def test_the_markdown_report(inner_gate_run: GateRun) -> None:
    report = (inner_gate_run.out / "report.md").read_text()
    assert report.splitlines()[0] == FAILED_TITLE
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
    assert f"| torch | {inner_gate_run.results.target.torch_version} (git " in report
    for size in (1, 2):  # the plots a check drew, beside the report
        assert f"![readings-w{size}](plots/readings-w{size}.png)" in report
        assert (inner_gate_run.out / "plots" / f"readings-w{size}.png").stat().st_size > 1000


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


def test_the_html_report_renders_in_headless_chromium(
    inner_gate_run: GateRun, tmp_path: Path
) -> None:
    from PIL import Image

    chromium = _chromium()
    page = (inner_gate_run.out / "report.html").as_uri()
    dom = _headless(chromium, tmp_path / "profile", "--dump-dom", page)
    assert 'id="matrix"' in dom
    assert "inner_gate.py::test_rank_one_differs[w2-ddp]" in dom
    assert "assert {'a': 1} == {'a': 2}" in dom
    source = (inner_gate_run.out / "report.html").read_text()
    assert "assert {&#x27;a&#x27;: 1} == {&#x27;a&#x27;: 2}" in source  # escaped, not markup
    assert '<img alt="plots/readings-w2.png" src="plots/readings-w2.png">' in source
    shot = inner_gate_run.out / "report.png"
    _headless(
        chromium, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1200,2400", page
    )
    colours = {rgb for _, rgb in Image.open(shot).convert("RGB").getcolors(maxcolors=1 << 20)}
    assert (0xCF, 0x22, 0x2E) in colours  # the title, in the failed run's red
    assert (0xFF, 0xD7, 0xD5) in colours  # matrix cells with failures
