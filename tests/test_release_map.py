"""The release map from recorded gate results: how each holding of a known divergence showed
in each release, each release's totals, and the failures no entry expects."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ci.gate.results import GateResults, TestResult
from ci.gate.target import ExecutionTarget
from ci.releases import cli, render
from ci.releases.table import release_map, showing
from conformance import UPSTREAM_MANIFEST
from conformance.divergences import Divergence, Holding, Known, load
from harness.outcomes import Outcome

# A skip record's test, and the record.
HANG = (
    "conformance/checks/test_upstream_failures.py::"
    "test_broadcast_from_rank0_of_a_sharded_state_dict_names_its_keys_or_loads_it[w2]"
)
HANG_RECORD = "broadcast-of-fsdp2-own-state-dict-hangs"
OFFLOAD = (
    "conformance/checks/test_upstream_failures.py::"
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


def _known(pattern: str) -> Known:
    holding = Holding((pattern,))
    return Known(Divergence("d", "https://example.org", "reason", (holding,)), holding)


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
    assert showing(_known("t.py::t[*"), tests) == expected


def test_the_map_orders_releases_and_names_what_no_entry_expects(tmp_path: Path) -> None:
    newer = _results(
        "2.15.0+cu132",
        [(f"{OFFLOAD}[w2-orig]", "xpassed"), ("conformance/checks/test_x.py::t[w2]", "failed")],
    )
    older = _results("2.13.0+cpu", [(f"{OFFLOAD}[w2-orig]", "xfailed")])
    table = release_map([("torch==2.15.0", newer), ("torch==2.13.0", older)])
    assert [run.release for run in table.runs] == ["2.13.0", "2.15.0"]
    holdings = [h for d in load(UPSTREAM_MANIFEST).divergences for h in d.holdings]
    assert len(table.rows) == len(holdings)
    offload, its_hang = [row for row in table.rows if row.id == "fsdp1-full-offload-crashes"]
    assert its_hang.showing == ["-", "-"]  # its other holding: tests these runs did not hold
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
    gate = {
        "torch==2.13.0": _results("2.13.0", [(HANG, "skipped")]),
        "torch==2.15.0": _results("2.15.0", [(HANG, "skipped")]),
    }
    lifted = {
        "torch==2.13.0": _results("2.13.0", [(HANG, "xfailed")]),
        "torch==2.15.0": _results("2.15.0", [(HANG, "xpassed")]),
    }
    (row,) = [row for row in release_map(list(gate.items()), lifted).rows if row.id == HANG_RECORD]
    assert row.showing == ["fails", "passes"]
    (unlifted,) = [row for row in release_map(list(gate.items())).rows if row.id == HANG_RECORD]
    assert unlifted.showing == ["not run", "not run"]


def test_an_earlier_runs_results_bring_the_run_of_their_skips_lifted_beside_them(
    tmp_path: Path,
) -> None:
    with_lifted, without = tmp_path / "a" / "results.json", tmp_path / "b" / "results.json"
    for path in (with_lifted, without):
        path.parent.mkdir()
        _results("2.13.0", [(HANG, "skipped")]).save(path)
    (with_lifted.parent / cli.LIFTED).mkdir()
    _results("2.13.0", [(HANG, "xpassed")]).save(with_lifted.parent / cli.LIFTED / "results.json")
    for results, expected in ((with_lifted, "passes"), (without, "not run")):
        out = tmp_path / f"map-{results.parent.name}"
        assert cli.main([f"torch==2.13.0={results}", "--out", str(out)]) == 0
        rows = json.loads((out / "release-map.json").read_text())["rows"]
        (row,) = [row for row in rows if row["id"] == HANG_RECORD]
        assert row["showing"] == [expected]


def test_the_map_shows_which_golden_loads_fail_by_the_release_that_wrote_the_set() -> None:
    golden = "conformance/checks/test_golden_checkpoints.py::"
    run = _results(
        "2.15.0+cu132",
        [
            (
                f"{golden}test_golden_dcp_checkpoints_load_as_recorded[w2-2.13.0a0+fork-ddp]",
                "passed",
            ),
            (
                f"{golden}test_golden_dcp_checkpoints_load_as_recorded[w4-2.13.0a0+fork-tp]",
                "failed",
            ),
            (f"{golden}test_golden_fsdp1_state_dicts_load_as_recorded[w2-2.6.0-full]", "xfailed"),
            (f"{golden}test_golden_single_process_state_loads_as_recorded[w1-2.6.0-mlp]", "passed"),
            ("conformance/checks/test_x.py::t[w2-2.6.0-a]", "failed"),
        ],
    )
    (only,) = release_map([("torch==2.15.0", run)]).runs
    assert [(g.written_by, g.checks, g.failed) for g in only.golden] == [
        ("2.6.0", 2, [f"{golden}test_golden_fsdp1_state_dicts_load_as_recorded[w2-2.6.0-full]"]),
        (
            "2.13.0a0+fork",
            2,
            [f"{golden}test_golden_dcp_checkpoints_load_as_recorded[w4-2.13.0a0+fork-tp]"],
        ),
    ]
    text = render.markdown(release_map([("torch==2.15.0", run)]))
    assert (
        "| 2.15.0 | 2.13.0a0+fork | 1 of 2 | "
        "test_golden_dcp_checkpoints_load_as_recorded[w4-2.13.0a0+fork-tp] |"
    ) in text


def test_a_map_without_golden_checks_has_no_golden_section() -> None:
    run = _results("2.15.0+cu132", [("conformance/checks/test_x.py::t[w2]", "passed")])
    table = release_map([("torch==2.15.0", run)])
    assert table.runs[0].golden == []
    assert "Golden checkpoints loaded" not in render.markdown(table)
    assert "Golden checkpoints loaded" not in render.html(table)


def test_golden_sets_reach_every_run_of_the_releases(monkeypatch, tmp_path: Path) -> None:
    seen: list[dict[str, str]] = []

    def fake_run(command: list[str], cwd: Path, env: dict[str, str], check: bool) -> None:
        seen.append(env)

    monkeypatch.setattr(cli.subprocess, "run", fake_run)
    monkeypatch.delenv("GATE_GOLDEN_SETS", raising=False)
    cli.run_gate("torch==2.15.0", "gloo4", tmp_path, tmp_path / "r", [], tmp_path / "sets")
    cli.run_gate("torch==2.15.0", "gloo4", tmp_path, tmp_path / "r", [])
    assert seen[0]["GATE_GOLDEN_SETS"] == str((tmp_path / "sets").resolve())
    assert "GATE_GOLDEN_SETS" not in seen[1]


def test_test_paths_after_the_separator_go_to_pytest_not_to_the_releases(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[tuple[str, list[str], Path | None]] = []

    def fake_gate(
        requirement: str, env: str, workdir: Path, report: Path, args: list[str], sets: Path | None
    ) -> Path:
        calls.append((requirement, args, sets))
        return report / "results.json"  # left by no run: the map says so and exits 1

    monkeypatch.setattr(cli, "run_gate", fake_gate)
    argv = ["--golden-sets", str(tmp_path), "torch==2.13.0", "--no-lift-skips", "-x"]
    argv += ["--out", str(tmp_path / "map"), "--", "conformance/checks/test_golden_checkpoints.py"]
    assert cli.main(argv) == 1
    assert calls == [
        ("torch==2.13.0", ["-x", "conformance/checks/test_golden_checkpoints.py"], tmp_path)
    ]
