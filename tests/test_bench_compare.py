"""The benchmark comparison: its statistics, the replay clock, cases, and a real A/B run
that must flag an injected slowdown."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ci.bench import compare as bench_compare
from ci.bench.cases import BenchCase, cases
from ci.bench.memory_stats import compare_peaks, ranks_resolution
from ci.bench.ops import with_regressions, writer_of
from ci.bench.replay_clock import ReplayClock
from ci.bench.runs import read_timings
from ci.bench.stats import (
    CONFIDENCE,
    IMPROVEMENT,
    POWER,
    REGRESSION,
    UNCHANGED,
    Runs,
    compare,
    ratio_interval,
    t_quantile,
)
from ci.gate.target import SUITE_ROOT


def _runs(median: float, seed: int, runs: int = 4, rounds: int = 10) -> Runs:
    """``runs`` runs of ``rounds`` rounds around ``median``, 2% noise, each run off by up
    to 1% as a run on a shared machine is."""
    rng = np.random.default_rng(seed)
    return tuple(
        tuple(
            median * (1 + 0.01 * rng.standard_normal()) * (1 + 0.02 * rng.standard_normal(rounds))
        )
        for _ in range(runs)
    )


def test_the_interval_brackets_the_true_ratio() -> None:
    interval = ratio_interval(_runs(1.0, 1, runs=8), _runs(1.10, 2, runs=8))
    assert interval.low < 1.10 < interval.high
    assert interval.low < interval.ratio < interval.high
    assert interval.high - interval.low < 0.08


def test_a_slow_moment_shared_by_a_pairs_runs_cancels() -> None:
    """Pair i's runs ran in lockstep: a factor of the machine's moment (here up to 40%) falls
    on both, and the 10% slowdown is found in a narrow interval all the same."""
    moments = np.exp(0.2 * np.random.default_rng(5).standard_normal((8, 1)))
    baseline = tuple(map(tuple, moments * np.array(_runs(1.0, 1, runs=8))))
    candidate = tuple(map(tuple, moments * np.array(_runs(1.10, 2, runs=8))))
    interval = ratio_interval(baseline, candidate)
    assert interval.low < 1.10 < interval.high
    assert interval.high - interval.low < 0.08
    assert compare("op", baseline, candidate, threshold=1.05).verdict == REGRESSION


def test_run_to_run_spread_widens_the_interval() -> None:
    steady = ratio_interval(_runs(1.0, 1), _runs(1.0, 2))
    one_slow_run = (*_runs(1.0, 2)[:3], tuple(1.3 * t for t in _runs(1.0, 2)[3]))
    shaky = ratio_interval(_runs(1.0, 1), one_slow_run)
    assert shaky.high - shaky.low > 2 * (steady.high - steady.low)


@pytest.mark.parametrize(
    ("candidate_median", "verdict"),
    [(1.10, REGRESSION), (1.0, UNCHANGED), (0.90, IMPROVEMENT), (1.02, UNCHANGED)],
)
def test_verdicts_follow_the_interval_and_the_threshold(
    candidate_median: float, verdict: str
) -> None:
    result = compare("op", _runs(1.0, 1), _runs(candidate_median, 2), threshold=1.05)
    assert result.verdict == verdict


@pytest.mark.parametrize(
    ("p", "df", "table"),
    [
        (0.975, 10, 2.228),
        (0.995, 5, 4.032),
        (0.999, 9, 4.297),  # ten pairs, the default
        (0.999, 20, 3.552),
        (0.999, 34, 3.348),
        (0.8, 8, 0.889),
    ],
)
def test_t_quantiles_match_the_tables(p: float, df: float, table: float) -> None:
    assert t_quantile(p, df) == pytest.approx(table, rel=0.01)


def _log_normal_runs(rng: np.random.Generator, median: float, noise: float, runs: int) -> Runs:
    return tuple((median * float(np.exp(noise * rng.standard_normal())),) for _ in range(runs))


@pytest.mark.parametrize("noise", [0.02, 0.06])
def test_a_slowdown_of_the_minimum_detectable_effect_is_caught_as_often_as_promised(
    noise: float,
) -> None:
    """The MDE promises the slowdown it is flagged POWER of the time: simulate it."""
    rng = np.random.default_rng(7)
    runs = 12
    mdes = [
        compare("op", *(_log_normal_runs(rng, 1.0, noise, runs) for _ in "ab"), 1.05).mde
        for _ in range(200)
    ]
    effect = float(np.median(mdes))
    caught = [
        compare(
            "op",
            _log_normal_runs(rng, 1.0, noise, runs),
            _log_normal_runs(rng, 1.0 + effect, noise, runs),
            1.05,
        ).verdict
        == REGRESSION
        for _ in range(400)
    ]
    assert effect > (0.05 if noise == 0.02 else 0.10)
    assert abs(np.mean(caught) - POWER) < 0.1


def test_a_build_compared_with_itself_is_rarely_flagged() -> None:
    rng = np.random.default_rng(11)
    flagged = [
        compare("op", *(_log_normal_runs(rng, 1.0, 0.08, 18) for _ in "ab"), 1.05).verdict
        != UNCHANGED
        for _ in range(10000)
    ]
    assert np.mean(flagged) < 1.75 * (1 - CONFIDENCE)  # 20 flags expected, give or take 4.5


def test_the_interval_is_reproducible() -> None:
    a, b = _runs(1.0, 3), _runs(1.2, 4)
    assert ratio_interval(a, b) == ratio_interval(a, b)


def test_bad_comparisons_are_refused() -> None:
    with pytest.raises(ValueError, match="runs come in pairs: 1 of the baseline, 2 of"):
        ratio_interval(((1.0,),), ((1.0,), (1.0,)))
    with pytest.raises(ValueError, match="at least two runs"):
        ratio_interval(((1.0,),), ((1.0,),))
    with pytest.raises(ValueError, match="at least two runs"):
        ratio_interval(((), (1.0,)), ((1.0,), (1.0,)))
    with pytest.raises(ValueError, match="threshold"):
        compare("op", ((1.0,), (1.0,)), ((1.0,), (1.0,)), threshold=0.9)


def test_the_replay_clock_advances_by_each_measured_round() -> None:
    clock = ReplayClock()
    assert clock.load([0.5, 0.25]) == 2
    start = clock.now()
    clock.replay_round()
    middle = clock.now()
    clock.replay_round()
    assert (middle - start, clock.now() - middle) == (0.5, 0.25)
    with pytest.raises(ValueError, match="non-negative"):
        clock.load([-1.0])


def test_a_clock_with_unreplayed_rounds_refuses_more() -> None:
    clock = ReplayClock()
    clock.load([1.0])
    with pytest.raises(RuntimeError, match="never replayed"):
        clock.load([1.0])


def test_cases_are_validated_and_named() -> None:
    assert BenchCase("get_state_dict", 4, "fsdp2").name == "get_state_dict-fsdp2-4MiB"
    assert BenchCase("gather", 32).name == "gather-32MiB"
    with pytest.raises(ValueError, match="parallelism is needed exactly"):
        BenchCase("gather", 4, "ddp")
    with pytest.raises(ValueError, match="unknown operation"):
        BenchCase("gatherr", 4)
    assert [writer_of(cell) for cell in ("ddp", "fsdp2", "tp")] == ["fsdp2", "tp", "fsdp2"]
    names = [case.name for case in cases((4,))]
    # Six utilities, six model operations for four cells, less FSDP1's async save.
    assert len(names) == len(set(names)) == 6 + 6 * 4 - 1
    assert "async_save-fsdp1_full_shard_orig-4MiB" not in names
    assert "async_save-fsdp2-4MiB" in names


def test_an_injected_slowdown_is_the_fraction_asked_for() -> None:
    """A call of 1 ms made 10% slower takes 0.1 ms more, within 0.04 ms in the fastest of
    its calls (an interruption only makes a call slower): a sleep of 0.1 ms took at least
    0.15 ms on this project's machine."""
    import time

    def one_millisecond() -> None:
        start = time.perf_counter()
        while time.perf_counter() < start + 1e-3:
            pass

    slower = with_regressions(one_millisecond, 0.10, 0)
    extra = []
    for _ in range(31):
        start = time.perf_counter()
        slower()
        extra.append(time.perf_counter() - start - 1e-3)
    assert min(extra) < 0.14e-3


MIB = 2**20


@pytest.mark.parametrize(
    ("baseline", "candidate", "verdict"),
    [
        ((100 * MIB, 101 * MIB), (106 * MIB, 107 * MIB), REGRESSION),
        ((100 * MIB, 101 * MIB), (104 * MIB, 104 * MIB), UNCHANGED),  # below the threshold
        ((100 * MIB, 120 * MIB), (110 * MIB, 126 * MIB), UNCHANGED),  # the runs overlap
        ((100 * MIB, 100 * MIB), (90 * MIB, 91 * MIB), IMPROVEMENT),
        ((MIB, MIB), (3 * MIB, 3 * MIB), REGRESSION),  # small, but far above the resolution
        # 5% more of 1 MiB, but within what the probe can miss
        ((MIB, MIB), (MIB + ranks_resolution(), MIB + ranks_resolution()), UNCHANGED),
    ],
)
def test_peak_verdicts_need_the_threshold_and_separate_runs(
    baseline: tuple[int, ...], candidate: tuple[int, ...], verdict: str
) -> None:
    assert compare_peaks("op", baseline, candidate, threshold=1.05).verdict == verdict


def test_peak_spread_is_the_wider_sides_range() -> None:
    result = compare_peaks("op", (100, 110, 105), (200, 202), threshold=1.05)
    assert result.spread == pytest.approx(10 / 105)


def test_peaks_within_the_resolution_print_no_ratio() -> None:
    """0 against 4 KiB is a ratio of 4096 that means nothing; 1 against 2 MiB is a ratio."""
    assert compare_peaks("op", (0, 0), (4096, 4096), threshold=1.05).ratio_text == (
        "below resolution"
    )
    assert compare_peaks("op", (MIB, MIB), (2 * MIB, 2 * MIB), threshold=1.05).ratio_text == "2.000"


@pytest.mark.slow
def test_an_injected_slowdown_and_memory_regression_are_flagged(tmp_path: Path) -> None:
    """A candidate whose every timed torch function sleeps nine times its own duration (a 10x
    slowdown) and holds 4 MiB more: a copy and a gather are each flagged slower and each
    flagged for memory, in one comparison of runs in lockstep. The two runs of a pair time as
    many rounds as the one that wants more: the slowed copy's rounds reach the 10 ms budget
    long before the baseline's 64, and it times as many as the baseline all the same.

    Runs of a 0.08 ms copy are noisy (10-25% between runs). Five pairs give the paired
    interval 4 degrees of freedom (a 99.8% t quantile of 7.2), so its half-width reaches
    log(10) only if the pairs' log ratios spread by about 70%."""
    out = tmp_path / "compare"
    output, returncode = _compare(
        "--runs", "5", "--warmup-runs", "0", "--out", str(out),
        "--candidate-env", "GATE_BENCH_SLOWDOWN=9.0", "--candidate-env", "GATE_BENCH_EXTRA_MIB=4",
        "--", "--bench-sizes-mib", "2", "--bench-rounds", "6", "--bench-seconds", "0.01",
        "-k", "copy-2MiB or gather-2MiB",
    )  # fmt: skip
    assert returncode == 1, output
    raw = json.loads((out / "raw" / "candidate-0.json").read_text())
    benchmarks = {benchmark["name"]: benchmark for benchmark in raw["benchmarks"]}
    assert len(benchmarks) == 2
    for benchmark in benchmarks.values():
        assert benchmark["extra_info"]["world_size"] == 2
    for pair in range(5):
        baseline_rounds, _ = read_timings(out / "raw" / f"baseline-{pair}.json")
        candidate_rounds, _ = read_timings(out / "raw" / f"candidate-{pair}.json")
        for name, rounds in candidate_rounds.items():
            assert 6 <= len(rounds) == len(baseline_rounds[name]), (pair, name)
        copy = candidate_rounds[next(name for name in candidate_rounds if "copy" in name)]
        assert _rounds_within(copy, budget_s=0.01, at_least=6) < len(copy), (pair, copy)
    baseline = json.loads((out / "raw" / "baseline-0.json").read_text())
    gather = next(b for b in baseline["benchmarks"] if "gather-2MiB" in b["name"])
    assert gather["extra_info"]["peak_host_bytes"] >= 2 * MIB - ranks_resolution()
    report = (out / "report.md").read_text()
    assert "2 time and 2 memory regression(s)" in report
    for name in ("copy-2MiB", "gather-2MiB"):
        assert f"| {name} |" in report
        assert f"| {name} host |" in report
        assert (out / f"{name}.png").read_bytes().startswith(b"\x89PNG")
        assert f'<img src="{name}.png"' in (out / "report.html").read_text()
    assert report.count("| REGRESSION |") == 4


def _rounds_within(seconds: list[float], budget_s: float, at_least: int) -> int:
    """How many of these rounds a run alone would have timed: at least ``at_least``, then
    until they add up to ``budget_s`` (all of them where they never do: the slowed copy's
    rounds of about 8 ms reach 10 ms by its second)."""
    for count in range(at_least, len(seconds) + 1):
        if sum(seconds[:count]) >= budget_s:
            return count
    return len(seconds)


def _compare(*args: str) -> tuple[str, int]:
    """``python -m ci.bench.compare ARGS`` in the suite's root: its output and exit status."""
    completed = subprocess.run(
        [sys.executable, "-m", "ci.bench.compare", *args],
        cwd=SUITE_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return completed.stdout + completed.stderr, completed.returncode


def _collect(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pytest", "ci/bench/benchmarks", "--collect-only", "-q", *args]
    return subprocess.run(
        [*command, "-p", "no:cacheprovider"],
        cwd=SUITE_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.slow
def test_any_cell_of_the_matrix_can_be_benchmarked() -> None:
    from ci.bench.cases import known_parallelisms

    completed = _collect("--bench-parallelisms", "all", "--bench-sizes-mib", "4")
    assert completed.returncode == 0, completed.stdout
    cells = known_parallelisms(2)
    assert "fsdp1_no_shard_flat_nested" in cells
    for cell in cells:
        assert f"test_state_dict_op[dcp_load-{cell}-4MiB]" in completed.stdout


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 4])
def test_an_async_saves_blocking_part_and_a_resharded_load_are_timed(
    tmp_path: Path, world_size: int
) -> None:
    """The two operations run and are timed in a real world: each async save's write
    completes after the clock stops and before the round's collectives, and each resharded
    load reads a checkpoint another parallelism wrote."""
    raw = tmp_path / "bench.json"
    chosen = "async_save-fsdp2-4MiB or resharded_load-tp-4MiB or resharded_load-fsdp2-4MiB"
    completed = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "ci/bench/benchmarks/test_state_dict_ops.py"),
            *("-q", "-p", "no:cacheprovider", f"--benchmark-json={raw}", "-k", chosen),
            *("--bench-world-size", str(world_size), "--bench-sizes-mib", "4"),
            *("--bench-parallelisms", "fsdp2,tp", "--bench-rounds", "3", "--bench-seconds", "0"),
        ],
        cwd=SUITE_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    benchmarks = {b["param"]: b for b in json.loads(raw.read_text())["benchmarks"]}
    assert sorted(benchmarks) == [
        "async_save-fsdp2-4MiB",
        "resharded_load-fsdp2-4MiB",
        "resharded_load-tp-4MiB",
    ]
    for benchmark in benchmarks.values():
        assert benchmark["extra_info"]["world_size"] == world_size
        assert benchmark["stats"]["rounds"] == 3
        assert benchmark["stats"]["min"] > 0


@pytest.mark.slow
def test_a_cell_missing_at_the_world_size_is_a_usage_error() -> None:
    completed = _collect("--bench-parallelisms", "ddp,hsdp2")
    assert completed.returncode == 4
    assert "--bench-parallelisms: ['hsdp2'] do not run at this world size" in completed.stderr


@pytest.mark.parametrize(
    ("baseline", "candidate", "message"),
    [
        ({}, {}, "no benchmark ran on either build"),
        ({"copy-4MiB": [(1.0, 1.1)]}, {}, "copy-4MiB (only in the baseline)"),
        (
            {"copy-4MiB": [(1.0,)]},
            {"copy-4MiB": [(1.0,)], "gather-4MiB": [(2.0,)]},
            "gather-4MiB (only in the candidate)",
        ),
    ],
)
def test_a_comparison_with_nothing_to_judge_fails(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    baseline: dict[str, list[tuple[float, ...]]],
    candidate: dict[str, list[tuple[float, ...]]],
    message: str,
) -> None:
    """Every benchmark skipped on a side, or one missing there, is a failure, not 'no
    regression'."""
    runs_of = {"baseline": baseline, "candidate": candidate}
    torch_of = {"baseline": "2.13.0", "candidate": "2.13.0"}
    no_peaks: dict[str, dict[str, list[int]]] = {"baseline": {}, "candidate": {}}
    monkeypatch.setattr(bench_compare, "in_lockstep", lambda *args: (runs_of, torch_of, no_peaks))
    status = bench_compare.main(["--out", str(tmp_path)])
    assert status == bench_compare.NOTHING_COMPARED_EXIT != 0
    assert message in capsys.readouterr().err
