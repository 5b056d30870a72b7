"""The gate's tools over recorded results: a fork judged against its base release (verdict
classes, exit status), a fork's first manifest (entries that cover exactly what failed), and
the recorded durations that deadlines are fitted to."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from ci.gate import adopt, durations, fork_vs_base
from ci.gate.results import GateResults, ReleaseResolution, TestResult
from ci.gate.target import ExecutionTarget
from conformance.divergences import load, release_of
from harness.outcomes import Outcome

M = "conformance/checks/test_m.py"


def _target(torch_version: str) -> ExecutionTarget:
    return ExecutionTarget(
        torch_version, "abc", None, None, "gloo", "CPU", 0, (2,), "c0ffee", "3.11", "h", "today"
    )


def _test(nodeid: str, outcome: Outcome, first_failure: str = "") -> TestResult:
    cell = nodeid.partition("[")[2].rstrip("]").split("-")[1] if "-" in nodeid else "other"
    return TestResult(nodeid, outcome, 1.0, "m", cell, 2, first_failure=first_failure)


def _results(torch_version: str, *tests: TestResult) -> GateResults:
    return GateResults(_target(torch_version), 0, 1.0, tests=list(tests))


@pytest.mark.parametrize(
    ("base", "fork", "expected"),
    [
        ("passed", "failed", "fork_failure"),
        ("passed", "xfailed", "fork_failure"),  # a manifest may expect the fork's own bug
        ("xfailed", "xpassed", "fixed_by_fork"),
        ("failed", "passed", "fixed_by_fork"),
        ("xfailed", "xfailed", "shared_failure"),
        ("error", "failed", "shared_failure"),
        ("passed", "passed", "passing"),
        ("skipped", "failed", "not_compared"),
        (None, "failed", "not_compared"),
    ],
)
def test_each_pair_of_outcomes_has_one_verdict(
    base: Outcome | None, fork: Outcome | None, expected: str
) -> None:
    assert fork_vs_base.verdict(base, fork) == expected


def _pair(tmp_path: Path) -> tuple[Path, Path]:
    base = _results(
        "2.13.0",
        _test(f"{M}::test_a[w2-ddp]", "passed"),
        _test(f"{M}::test_b[w2-fsdp2]", "xfailed", "rank 0 failed: KeyError: 'x'"),
        _test(f"{M}::test_c[w2-tp]", "xfailed", "rank 1 failed: AssertionError"),
    )
    fork = _results(
        "2.13.0+fork",
        _test(f"{M}::test_a[w2-ddp]", "failed", "rank 1 failed: AssertionError: fc1.weight"),
        _test(f"{M}::test_b[w2-fsdp2]", "xpassed"),
        _test(f"{M}::test_c[w2-tp]", "xfailed", "rank 1 failed: AssertionError"),
    )
    paths = tmp_path / "base.json", tmp_path / "fork.json"
    base.save(paths[0])
    fork.save(paths[1])
    return paths


def test_a_fork_failure_fails_the_verdict_and_is_named(tmp_path: Path) -> None:
    base, fork = _pair(tmp_path)
    out = tmp_path / "out"
    assert fork_vs_base.main([str(base), str(fork), "--out", str(out)]) == 1
    data = json.loads((out / "fork-vs-base.json").read_text())
    assert [d["nodeid"] for d in data["by_verdict"]["fork_failure"]] == [f"{M}::test_a[w2-ddp]"]
    assert [d["nodeid"] for d in data["by_verdict"]["fixed_by_fork"]] == [f"{M}::test_b[w2-fsdp2]"]
    assert [d["nodeid"] for d in data["by_verdict"]["shared_failure"]] == [f"{M}::test_c[w2-tp]"]
    report = (out / "fork-vs-base.md").read_text()
    assert report.startswith("# Fork against base: FAILED: 1 failures of the fork's own")
    assert "| `conformance/checks/test_m.py::test_a[w2-ddp]` | passed | failed |" in report
    assert "rank 1 failed: AssertionError: fc1.weight" in report


def test_a_fork_that_only_fixes_and_shares_passes(tmp_path: Path) -> None:
    base, fork = _pair(tmp_path)
    fork_results = GateResults.load(fork)
    fork_results.tests[0] = _test(f"{M}::test_a[w2-ddp]", "passed")
    fork_results.save(fork)
    assert fork_vs_base.main([str(base), str(fork), "--out", str(tmp_path / "out")]) == 0


def test_adopted_entries_cover_exactly_the_failures(tmp_path: Path) -> None:
    results = _results(
        "2.13.0+fork",
        _test(f"{M}::test_a[w2-ddp-full]", "failed", "rank 1 failed: KeyError: 'step'"),
        _test(f"{M}::test_a[w2-ddp-sharded]", "failed", "rank 0 failed: KeyError: 'step'"),
        _test(f"{M}::test_a[w2-fsdp2-full]", "failed", "rank 0 failed: KeyError: 'step'"),
        _test(f"{M}::test_a[w2-fsdp2-sharded]", "passed"),
        _test(f"{M}::test_h[w2-tp]", "failed", "rank 1 hung: did not finish within 300 s"),
        _test(f"{M}::test_x[w2-tp]", "xfailed", "rank 0 failed: known upstream"),
    )
    path = tmp_path / "fork.toml"
    link = "https://example.org/fork/issues/1"
    path.write_text(adopt.manifest_text(results, link))
    records = [h for d in load(path).divergences for h in d.known_in(release_of("2.13.0"))]
    assert [(d.id, d.tests, d.reason, d.link, d.skip) for d in records] == [
        ("adopted-1", (f"{M}::test_a[*ddp*]",), "failed: KeyError: 'step'", link, None),
        ("adopted-2", (f"{M}::test_a[w2-fsdp2-full]",), "failed: KeyError: 'step'", link, None),
        ("adopted-3", (f"{M}::test_h[w2-tp]",), "hung: did not finish within 300 s", link, "hang"),
    ]
    matched = {t.nodeid for t in results.tests if any(d.matches(t.nodeid) for d in records)}
    assert matched == {t.nodeid for t in results.tests if t.outcome == "failed"}


def test_adopt_takes_a_url_for_its_link(tmp_path: Path) -> None:
    results = _results("2.13.0+fork", _test(f"{M}::test_a[w2-ddp]", "failed", "rank 0 failed"))
    with pytest.raises(ValueError, match="link must be a URL"):
        adopt.manifest_text(results, "TODO")


def test_recorded_durations_are_the_longest_complete_run_of_each_test_function() -> None:
    results = _results(
        "2.13.0",
        _test(f"{M}::test_a[w2-ddp]", "passed"),
        _test(f"{M}::test_a[w4-ddp]", "xfailed"),
        _test(f"{M}::test_h[w2-tp]", "failed", "rank 1 hung: did not finish within 300 s"),
        _test(f"{M}::test_f[w2-tp]", "failed", "rank 0 failed: KeyError"),
        _test(f"{M}::test_x[w2-tp]", "xfailed", "rank 1 hung: still running 5 s after rank 0"),
        TestResult(f"{M}::test_plain", "passed", 2.0, "m", "other", None),
    )
    results.tests[1] = TestResult(f"{M}::test_a[w4-ddp]", "xfailed", 3.5, "m", "ddp", 4)
    assert durations.durations(results) == {f"{M}::test_a": 3.5}


def test_shard_weights_are_the_mean_of_each_test_function_at_each_world_size() -> None:
    results = _results(
        "2.13.0",
        TestResult(f"{M}::test_a[w2-ddp]", "passed", 1.0, "m", "ddp", 2),
        TestResult(f"{M}::test_a[w4-ddp]", "xfailed", 4.0, "m", "ddp", 4),
        TestResult(f"{M}::test_a[w4-tp]", "skipped", 0.5, "m", "tp", 4),
        _test(f"{M}::test_a[w2-tp]", "xfailed", "rank 1 hung: did not finish within 30 s"),
        TestResult(f"{M}::test_plain", "passed", 2.0, "m", "other", None),
    )
    results.tests[3] = replace(results.tests[3], duration_s=30.0)  # the hang cost its deadline
    assert durations.mean_durations(results) == {
        f"{M}::test_a[w2]": 15.5,
        f"{M}::test_a[w4]": 2.25,
        f"{M}::test_plain": 2.0,
    }


def test_an_update_replaces_and_adds_measured_functions_and_keeps_the_others() -> None:
    recorded = {f"{M}::test_z": 1.0, f"{M}::test_b": 2.0}
    measured = {f"{M}::test_b": 5.0, f"{M}::test_a": 3.0}
    assert list(durations.updated(recorded, measured).items()) == [
        (f"{M}::test_a", 3.0),
        (f"{M}::test_b", 5.0),
        (f"{M}::test_z", 1.0),
    ]


def test_the_report_says_which_recorded_releases_an_unrecorded_one_lies_between() -> None:
    between = ReleaseResolution(
        "2.11.0", False, "2.15.0", ("a: t",), lies_between="2.8.0 and 2.13.0"
    )
    assert between.describe() == (
        "release 2.11.0 is not recorded (between recorded 2.8.0 and 2.13.0): 1 known "
        "divergences inferred from their release ranges"
    )
    newer = ReleaseResolution("2.16.0", False, "2.15.0", ())
    assert newer.describe().startswith("release 2.16.0 is not recorded (newest recorded: 2.15.0)")
