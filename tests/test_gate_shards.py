"""Shards of a gate run: their union is the whole id set, no id twice, of near-equal recorded
time, and the merged report equals one run's; so does a run of jobs side by side."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from ci.gate import durations, merge, shard
from ci.gate.results import GateResults, TestResult
from ci.gate.target import ExecutionTarget
from harness.machine import MachineSignature
from tests._gate_suite import FAILED_TITLE, GateRun, gate_on_inner_suite

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]

IDS = [
    "conformance/checks/test_a.py::t[w1]",
    "conformance/checks/test_a.py::t[w2-ddp]",
    "conformance/checks/test_a.py::u[w2-fsdp2]",
    "conformance/checks/test_a.py::t[w4-ddp]",
    "conformance/checks/test_b.py::t[w2]",
    "conformance/checks/test_b.py::v[w2]",
    "conformance/checks/test_c.py::t[w4-tp]",
    "conformance/checks/test_d.py::plain",
]
DURATIONS = {
    "conformance/checks/test_a.py::t[w1]": 4.0,
    "conformance/checks/test_a.py::t[w2]": 4.0,
    "conformance/checks/test_a.py::t[w4]": 4.0,
    "conformance/checks/test_a.py::u[w2]": 1.0,
    "conformance/checks/test_b.py::t[w2]": 3.0,
    "conformance/checks/test_b.py::v[w2]": 3.0,
    "conformance/checks/test_c.py::t[w4]": 5.0,
    "conformance/checks/test_d.py::plain": 0.5,
}


@pytest.mark.parametrize("count", [1, 2, 3, 4, 8])
def test_the_shards_hold_every_id_once(count: int) -> None:
    parts = shard.split(IDS, DURATIONS, count)
    assert len(parts) == count
    every = [nodeid for part in parts for nodeid in part]
    assert sorted(every) == sorted(IDS)
    assert len(every) == len(set(every))


def test_a_modules_tests_at_one_world_size_stay_together_and_the_load_is_even() -> None:
    parts = shard.split(IDS, DURATIONS, 2)
    together = ("conformance/checks/test_b.py::t[w2]", "conformance/checks/test_b.py::v[w2]")
    assert any(set(together) <= set(part) for part in parts)
    loads = [sum(DURATIONS[durations.weight_key(i)] for i in part) for part in parts]
    # Dealt dearest first to the lighter part: b@2 (6) to one, a@2 (5) and c@4 (5) to the
    # other, a@1 (4) to the first, a@4 (4) to the first on a tie, test_d (0.5) to the second.
    assert sorted(loads) == [10.5, 14.0]


def test_a_group_heavier_than_a_shards_share_is_cut_into_runs_of_its_ids() -> None:
    long = [f"conformance/checks/test_long.py::t[w2-{n}]" for n in range(4)]
    ids = [*long, "conformance/checks/test_b.py::t[w2]", "conformance/checks/test_b.py::v[w2]"]
    weights = {**DURATIONS, "conformance/checks/test_long.py::t[w2]": 5.0}
    parts = shard.split(ids, weights, 2)
    # 26 s in all, 13 s a part: test_long (20 s) goes as two runs of two ids (10 s each), one
    # to each part; test_b (6 s) stays whole, on the first part at the tie.
    assert parts == [[*long[:2], *ids[4:]], long[2:]]
    assert sum(len(part) for part in parts) == len(ids)


def test_jobs_claim_the_largest_world_first_and_within_it_the_dearest_group() -> None:
    order = [claim for claim, _ in shard.claim_order(IDS, DURATIONS)]
    assert order == [
        ("test_c", 4, 0),
        ("test_a", 4, 0),
        ("test_b", 2, 0),  # 6 s
        ("test_a", 2, 0),  # 5 s
        ("test_a", 1, 0),
        ("test_d", 1, 0),  # a test of no world: 0.5 s
    ]


def test_jobs_claim_a_group_heavier_than_a_jobs_share_in_runs_of_its_ids() -> None:
    long = [f"conformance/checks/test_long.py::t[w2-{n}]" for n in range(5)]
    ids = [*long, "conformance/checks/test_b.py::t[w2]", "conformance/checks/test_b.py::v[w2]"]
    weights = {**DURATIONS, "conformance/checks/test_long.py::t[w2]": 4.0}
    # 26 s in all, 13 s a job at two: test_long (20 s) is cut in its order into runs within
    # 13 s, three ids (12 s) and two (8 s); test_b (6 s) stays whole; the dearest run first.
    assert shard.claim_order(ids, weights, jobs=2) == [
        (("test_long", 2, 0), long[:3]),
        (("test_long", 2, 1), long[3:]),
        (("test_b", 2, 0), ids[5:]),
    ]
    # One job: nothing outweighs its share, every group is one run.
    assert [claim for claim, _ in shard.claim_order(ids, weights)] == [
        ("test_long", 2, 0),
        ("test_b", 2, 0),
    ]


def test_each_run_is_run_whole_by_the_one_job_that_claims_it_first(tmp_path: Path) -> None:
    order = shard.claim_order(IDS, DURATIONS, jobs=2)
    claim_of = {nodeid: claim for claim, members in order for nodeid in members}
    jobs = [shard.Claims(tmp_path, claim_of), shard.Claims(tmp_path, claim_of)]
    ran: list[list[str]] = [[], []]
    for turn, (_, members) in enumerate(order):  # each job asks for every id as it comes due
        for nodeid in members:
            for index in (turn % 2, 1 - turn % 2):
                if jobs[index].ours(nodeid):
                    ran[index].append(nodeid)
    assert sorted(ran[0] + ran[1]) == sorted(IDS)
    assert len(ran[0]) + len(ran[1]) == len(IDS)
    assert all(ran)
    for _, members in order:
        assert set(members) <= set(ran[0]) or set(members) <= set(ran[1])


# A module of three heavy ids, cut into three runs for two jobs, and a light module after it;
# each module's fixture logs its set-up and teardown.
CUT_MODULE = """
import pytest

@pytest.fixture(scope="module")
def module_state():
    with open("log", "a") as log:
        log.write("set up {name}\\n")
    yield
    with open("log", "a") as log:
        log.write("tear down {name}\\n")

@pytest.mark.parametrize("case", {cases})
def test_t(module_state, case):
    pass
"""


@pytest.mark.parametrize(
    ("taken", "ran", "log"),
    [
        ((1, 2), ["a", "n"], ["set up m", "tear down m", "set up n", "tear down n"]),
        ((1,), ["a", "c", "n"], ["set up m", "tear down m"] * 2 + ["set up n", "tear down n"]),
    ],
)
def test_a_job_tears_down_a_run_whose_next_ids_another_job_claimed(
    tmp_path: Path, taken: tuple[int, ...], ran: list[str], log: list[str]
) -> None:
    """A job that runs a run of module M's ids, then finds M's next runs claimed, tears M
    down before the next test it runs (pytest would keep M for the next id in order, and
    the job's next test, of another module, would error: "previous item was not torn down
    properly")."""
    (tmp_path / "test_m.py").write_text(
        CUT_MODULE.format(name="m", cases='["w2-a", "w2-b", "w2-c"]')
    )
    (tmp_path / "test_n.py").write_text(CUT_MODULE.format(name="n", cases='["w2-n"]'))
    weights = tmp_path / "durations.json"
    weights.write_text(json.dumps({"test_m.py::test_t[w2]": 10.0, "test_n.py::test_t[w2]": 1.0}))
    claims = tmp_path / "claims"
    claims.mkdir()
    for piece in taken:  # the runs another job claimed first
        (claims / f"test_m[w2]#{piece}").touch()
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "ci.gate.shard",
            "-p",
            "no:cacheprovider",
            f"--gate-claims={claims}",
            "--gate-claim-jobs=2",
            f"--gate-shard-durations={weights}",
            "-rA",
            "test_m.py",
            "test_n.py",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output
    passed = sorted(
        line.rsplit("-", 1)[1].rstrip("]")
        for line in output.splitlines()
        if line.startswith("PASSED ")
    )
    assert passed == ran, output
    assert (tmp_path / "log").read_text().splitlines() == log


@pytest.mark.parametrize("text", ["0/2", "3/2", "2", "a/b"])
def test_a_shard_is_k_of_n(text: str) -> None:
    with pytest.raises(ValueError, match="K"):
        shard.parse_shard(text)


def _run(out: Path, suite: Path, manifest: Path, *extra: str, after: tuple[str, ...] = ()) -> None:
    completed = gate_on_inner_suite(suite, manifest, out, *extra, after=after)
    assert (out / "results.json").exists(), completed.stdout + completed.stderr


def _comparable(results: GateResults) -> dict[str, object]:
    """What a report says, less when and how long it ran."""
    data = asdict(results)
    data.pop("duration_s")
    data.pop("target")
    data["tests"] = sorted(
        (test["nodeid"], test["outcome"], test["first_failure"], test["reason"])
        for test in data["tests"]
    )
    return data


@pytest.fixture(scope="module")
def second_shard(tmp_path_factory: pytest.TempPathFactory, inner_gate_run: GateRun) -> Path:
    """The reports of shard 2 of 2 of the inner suite, chosen as tox passes the option."""
    out = tmp_path_factory.mktemp("shard2")
    _run(out, inner_gate_run.suite, inner_gate_run.manifest, after=("--gate-shard=2/2",))
    return out


def test_merged_shards_report_what_one_run_does(
    tmp_path: Path, inner_gate_run: GateRun, second_shard: Path
) -> None:
    suite, manifest = inner_gate_run.suite, inner_gate_run.manifest
    _run(tmp_path / "shard1", suite, manifest, "--gate-shard", "1/2")
    shards = [tmp_path / "shard1", second_shard]
    assert all(GateResults.load(shard_out / "results.json").tests for shard_out in shards)

    assert merge.main([*map(str, shards), "--out", str(tmp_path / "merged")]) == 1
    _assert_reports_one_run(tmp_path / "merged", inner_gate_run.results)


def _assert_reports_one_run(out: Path, whole: GateResults) -> None:
    merged = GateResults.load(out / "results.json")
    assert _comparable(merged) == _comparable(whole)
    assert merged.unused_entries  # the stale record of the fork's manifest, as one run finds it
    cases = ElementTree.parse(out / "junit.xml").getroot().iter("testcase")
    assert len(list(cases)) == len(whole.tests)
    report = (out / "report.md").read_text()
    assert report.splitlines()[0] == FAILED_TITLE
    for size in (1, 2):  # the plots of whichever shard or job drew them
        assert f"![readings-w{size}](plots/readings-w{size}.png)" in report
        assert (out / "plots" / f"readings-w{size}.png").is_file()


def test_jobs_side_by_side_report_what_one_run_does(
    tmp_path: Path, inner_gate_run: GateRun
) -> None:
    whole = inner_gate_run.results
    completed = gate_on_inner_suite(
        inner_gate_run.suite, inner_gate_run.manifest, tmp_path / "out", "--jobs", "2"
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 1, output
    _assert_reports_one_run(tmp_path / "out", whole)
    parts = [GateResults.load(tmp_path / "out" / "jobs" / f"{j}" / "results.json") for j in (1, 2)]
    # Each ran the groups it claimed first (most often one each; a quick job may take both).
    assert sum(len(part.tests) for part in parts) == len(whole.tests)
    assert "[job 1/2] " in output
    assert "[job 2/2] " in output


def test_the_jobs_of_a_shard_run_that_shard(
    tmp_path: Path, inner_gate_run: GateRun, second_shard: Path
) -> None:
    """``--jobs`` runs the runner's shard alone, its jobs claiming its groups; a job that
    claims none (three jobs, fewer groups) does not fail the run."""
    completed = gate_on_inner_suite(
        inner_gate_run.suite,
        inner_gate_run.manifest,
        tmp_path / "jobs",
        "--gate-shard",
        "2/2",
        after=("--jobs=3",),
    )
    alone = GateResults.load(second_shard / "results.json")
    jobs = GateResults.load(tmp_path / "jobs" / "results.json")
    assert completed.returncode == alone.exit_status, completed.stdout + completed.stderr
    assert _comparable(jobs) == _comparable(alone)


def results_of(torch_version: str, nodeids: list[str]) -> GateResults:
    """Results of ``nodeids``, each passed at 2 ranks, on a CPU build of ``torch_version``."""
    target = ExecutionTarget(
        torch_version, "abc", None, None, "gloo", "CPU", 0, (2,), "c0ffee", "3.11", "h", "d"
    )
    tests = [TestResult(nodeid, "passed", 1.0, "m", "other", 2) for nodeid in nodeids]
    return GateResults(target, 0, 60.0, tests=tests)


def test_merge_refuses_an_id_run_twice_and_shards_of_two_builds() -> None:
    twice = [results_of("2.13.0", ["m.py::t[w2]"]), results_of("2.13.0", ["m.py::t[w2]"])]
    with pytest.raises(ValueError, match=r"m.py::t\[w2\] ran in shards 1 and 2"):
        merge.merged_results(twice)
    builds = [results_of("2.13.0", ["m.py::t[w2]"]), results_of("2.15.0", ["m.py::u[w2]"])]
    with pytest.raises(
        ValueError, match=r"shards of different builds: torch 2\.13\.0 and 2\.15\.0"
    ):
        merge.merged_results(builds)


def test_a_merged_run_names_every_machine_its_shards_ran_on() -> None:
    """Shards may run on runners of other CPUs: the merged report names each signature once."""
    avx2 = MachineSignature("x86_64", "CPU", "id", "f0", "AVX2", "blas mkl", 1, "glibc 2.36")
    avx512 = replace(avx2, capability="AVX512")
    shards = [results_of("2.13.0", [f"m.py::t{k}[w2]"]) for k in range(3)]
    for part, machine in zip(shards, (avx2, avx512, avx2), strict=True):
        part.target = replace(part.target, machines=(machine,))
    assert merge.merged_results(shards).target.machines == (avx2, avx512)


def test_merge_names_a_shard_without_results(tmp_path: Path, capsys) -> None:
    assert merge.main([str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert f"no results.json in {tmp_path}" in capsys.readouterr().err
