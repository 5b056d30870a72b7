"""The release map from recorded gate results: how each known divergence showed in each
release, each release's totals, and the failures no entry expects."""

from __future__ import annotations

from pathlib import Path

import pytest

from ci.gate.results import GateResults, TestResult
from ci.gate.target import ExecutionTarget
from ci.releases import cli, render
from ci.releases.table import release_map, showing
from conformance import UPSTREAM_MANIFEST
from harness.manifest import Divergence, load
from harness.outcomes import Outcome

OFFLOAD = (
    "conformance/test_upstream_failures.py::"
    "test_fsdp1_full_offloaded_state_dict_equals_single_process"
)


def _results(torch_version: str, tests: list[tuple[str, Outcome]]) -> GateResults:
    target = ExecutionTarget(
        torch_version, "abc", None, None, "gloo", "CPU", 0, (2,), "c0ffee", "3.11", "h", "d"
    )
    records = [
        TestResult(nodeid, outcome, 1.0, "m", "other", 2, first_failure="rank 0 failed: boom")
        for nodeid, outcome in tests
    ]
    return GateResults(target, 0, 120.0, tests=records)


def _divergence(pattern: str) -> Divergence:
    return Divergence("d", "https://example.org", "reason", (pattern,))


@pytest.mark.parametrize(
    ("outcomes", "expected"),
    [
        ((), "-"),
        (("xfailed", "passed"), "fails"),
        (("failed",), "fails"),
        (("xpassed", "passed"), "passes"),
        (("skipped", "skipped"), "not run"),
    ],
)
def test_a_divergence_shows_by_the_outcomes_of_its_tests(
    outcomes: tuple[Outcome, ...], expected: str
) -> None:
    tests = [
        TestResult(f"t.py::t[w{i}]", outcome, 1.0, "t", "other", 2)
        for i, outcome in enumerate(outcomes)
    ]
    tests.append(TestResult("t.py::other[w2]", "failed", 1.0, "t", "other", 2))
    assert showing(_divergence("t.py::t[*"), tests) == expected


def test_the_map_orders_releases_and_names_what_no_entry_expects(tmp_path: Path) -> None:
    newer = _results(
        "2.15.0+cu132",
        [(f"{OFFLOAD}[w2-orig]", "xpassed"), ("conformance/test_x.py::t[w2]", "failed")],
    )
    older = _results("2.13.0+cpu", [(f"{OFFLOAD}[w2-orig]", "xfailed")])
    table = release_map([("torch==2.15.0", newer), ("torch==2.13.0", older)])
    assert [run.release for run in table.runs] == ["2.13.0", "2.15.0"]
    assert len(table.rows) == len(load(UPSTREAM_MANIFEST).divergences)
    (offload,) = [row for row in table.rows if row.id == "fsdp1-full-state-dict-with-offload-to"]
    assert offload.showing == ["fails", "passes"]
    assert offload.fitted == ">=2.13,<2.15.0"  # what these two runs alone can tell
    assert table.runs[1].unexplained == [("failed: boom", 1)]
    assert table.runs[0].duration_min == 2.0
    text = render.markdown(table)
    assert "| 2.15.0 | 1 | failed: boom |" in text
    assert "| >=2.6,<2.14.1 | >=2.13,<2.15.0 | fails | passes |" in text
    assert "<td>passes</td>" in render.html(table)


def test_a_requirement_may_name_an_earlier_runs_results(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    _results("2.13.0", []).save(results)
    assert cli._recorded_run(f"torch==2.13.0={results}") == ("torch==2.13.0", results)
    assert cli._recorded_run("torch==2.15.0") == ("torch==2.15.0", None)
    assert cli.slug("torch==2.15.0") == "torch-2.15.0"
    assert cli.slug("/w/torch-2.13.0a0+fork-cp311-linux_x86_64.whl") == (
        "torch-2.13.0a0+fork-cp311-linux_x86_64.whl"
    )
    out = tmp_path / "map"
    assert cli.main([f"torch==2.13.0={results}", "--out", str(out)]) == 0
    assert (out / "release-map.json").exists()


def test_a_skip_record_shows_by_its_run_with_the_skip_lifted() -> None:
    hang = (
        "conformance/test_upstream_failures.py::"
        "test_broadcast_from_rank0_of_a_sharded_state_dict_names_its_keys_or_loads_it[w2]"
    )
    gate = {
        "torch==2.13.0": _results("2.13.0", [(hang, "skipped")]),
        "torch==2.15.0": _results("2.15.0", [(hang, "skipped")]),
    }
    lifted = {
        "torch==2.13.0": _results("2.13.0", [(hang, "xfailed")]),
        "torch==2.15.0": _results("2.15.0", [(hang, "xpassed")]),
    }
    (row,) = [
        row
        for row in release_map(list(gate.items()), lifted).rows
        if row.id == "hang-given-an-fsdp2-model-s-own"
    ]
    assert row.showing == ["fails", "passes"]
    (unlifted,) = [
        row
        for row in release_map(list(gate.items())).rows
        if row.id == "hang-given-an-fsdp2-model-s-own"
    ]
    assert unlifted.showing == ["not run", "not run"]
