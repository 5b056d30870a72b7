"""Compare two torch builds' state-dict benchmarks on one machine, runs in lockstep.

    python -m ci.bench.compare --baseline-python A/bin/python --candidate-python B/bin/python \\
        [--runs 5] [--threshold 1.05] [--out bench-compare] [-- BENCHMARK PYTEST ARGS]

Each python is an environment with a torch build and this suite installed. The builds run
in pairs of runs, the two runs of a pair in lockstep (``ci.bench.lockstep``), so a slow
moment of the machine falls on both builds. Writes
``raw/`` (pytest-benchmark JSON per run), a PNG per benchmark, ``report.md`` and
``report.html``, times and peak memory side by side; exits 1 when a benchmark's ratio
interval lies above the threshold or its peak memory grew by ``--memory-threshold`` (default
5%) in every run, and 2 when a benchmark ran on one build only or none ran at all (nothing
to judge).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ci.bench import report as bench_report
from ci.bench.memory_stats import PeakComparison, compare_peaks
from ci.bench.runs import Build, env_pairs, read_peaks, read_timings, run_pair
from ci.bench.stats import REGRESSION, compare_all

REGRESSION_EXIT = 1
NOTHING_COMPARED_EXIT = 2  # a benchmark ran on one side only, or none ran at all
# Pairs of runs: a pair of runs of the default benchmarks takes about 1.7 to 2.8 minutes on a
# 2-core machine, and 5 pairs flagged a 10% slowdown in three in four or more of those of 1 ms
# or more (ci/bench/sample-report/README.md).
RUNS = 5


RunsOf = dict[str, dict[str, list[tuple[float, ...]]]]  # build -> benchmark -> runs' rounds
PeaksOf = dict[str, dict[str, list[int]]]  # build -> benchmark's memory -> runs' peaks


def in_lockstep(
    baseline: Build, candidate: Build, runs: int, warmup_runs: int, out: Path, args: list[str]
) -> tuple[RunsOf, dict[str, str], PeaksOf]:
    """Each benchmark's rounds and peak memory per build and run, over ``runs`` pairs of runs
    in lockstep (``ci.bench.lockstep``), the baseline taking the first turn in even pairs and
    the candidate in odd ones, after ``warmup_runs`` unrecorded pairs."""
    runs_of: RunsOf = {baseline.label: {}, candidate.label: {}}
    peaks_of: PeaksOf = {baseline.label: {}, candidate.label: {}}
    torch_of: dict[str, str] = {}
    for run in range(-warmup_runs, runs):
        order = (baseline, candidate) if run % 2 == 0 else (candidate, baseline)
        what = "warm-up" if run < 0 else f"pair {run + 1}/{runs}"
        print(f"bench_compare: {what}: {order[0].label} first", flush=True)
        names = tuple(
            f"{build.label}-warmup{-run}" if run < 0 else f"{build.label}-{run}" for build in order
        )
        raws = run_pair(order, (names[0], names[1]), out, args)
        for build, raw in zip(order, raws, strict=True):
            timings, torch_of[build.label] = read_timings(raw)
            if run < 0:
                continue
            for name, values in timings.items():
                runs_of[build.label].setdefault(name, []).append(tuple(values))
            for name, peak in read_peaks(raw).items():
                peaks_of[build.label].setdefault(name, []).append(peak)
    return runs_of, torch_of, peaks_of


def _describe(build: Build, torch_version: str) -> str:
    env = " ".join(f"{k}={v}" for k, v in build.env.items())
    return f"torch {torch_version} ({build.python}{', ' + env if env else ''})"


def _unmatched_message(runs_of: RunsOf, unmatched: list[str]) -> str:
    """Why the comparison cannot be judged: no benchmark ran, or some ran on one side only."""
    if not runs_of["baseline"] and not runs_of["candidate"]:
        return "no benchmark ran on either build: nothing was compared"
    sides = {name: "baseline" if name in runs_of["baseline"] else "candidate" for name in unmatched}
    listed = ", ".join(f"{name} (only in the {side})" for name, side in sides.items())
    return f"benchmarks missing on one side: {listed}" if unmatched else "nothing was compared"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ci.bench.compare", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--baseline-python", default=sys.executable)
    parser.add_argument("--candidate-python", default=sys.executable)
    parser.add_argument("--baseline-env", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--candidate-env", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--runs", type=int, default=RUNS, help=f"pairs of runs, at least 2 (default {RUNS})"
    )
    parser.add_argument(
        "--warmup-runs", type=int, default=0, help="unrecorded pairs of runs first (default 0)"
    )
    parser.add_argument("--threshold", type=float, default=1.05, help="slowdown ratio to fail")
    parser.add_argument(
        "--memory-threshold", type=float, default=1.05, help="peak memory ratio to fail"
    )
    parser.add_argument("--out", type=Path, default=Path("bench-compare"))
    parser.add_argument("pytest_args", nargs="*", help="after --: arguments for the benchmarks")
    args = parser.parse_args(argv)
    if args.runs < 2:
        parser.error("--runs: at least 2 pairs of runs (a spread needs two)")
    baseline = Build("baseline", args.baseline_python, env_pairs(args.baseline_env))
    candidate = Build("candidate", args.candidate_python, env_pairs(args.candidate_env))
    out: Path = args.out.resolve()
    runs_of, torch_of, peaks_of = in_lockstep(
        baseline, candidate, args.runs, args.warmup_runs, out, args.pytest_args
    )
    unmatched = sorted(set(runs_of["baseline"]) ^ set(runs_of["candidate"]))
    if unmatched or not runs_of["baseline"]:
        print(f"bench_compare: {_unmatched_message(runs_of, unmatched)}", file=sys.stderr)
        return NOTHING_COMPARED_EXIT
    prior, comparisons = compare_all(
        {name: tuple(runs) for name, runs in runs_of["baseline"].items()},
        {name: tuple(runs) for name, runs in runs_of["candidate"].items()},
        args.threshold,
    )
    peaks: list[PeakComparison] = [
        compare_peaks(
            name,
            tuple(peaks_of["baseline"][name]),
            tuple(peaks_of["candidate"].get(name, ())),
            args.memory_threshold,
        )
        for name in peaks_of["baseline"]
        if peaks_of["candidate"].get(name)
    ]
    plots = {}
    for comparison in comparisons:
        png = f"{comparison.name}.png"
        bench_report.plot(comparison, out / png)
        plots[comparison.name] = png
    builds = bench_report.Builds(
        _describe(baseline, torch_of["baseline"]),
        _describe(candidate, torch_of["candidate"]),
        args.runs,
        args.threshold,
        args.memory_threshold,
        prior,
    )
    (out / "report.md").write_text(bench_report.markdown(comparisons, peaks, builds, plots))
    (out / "report.html").write_text(bench_report.html(comparisons, peaks, builds, plots))
    for comparison in comparisons:
        print(
            f"{comparison.name:<40} x{comparison.ratio:.3f} "
            f"[{comparison.low:.3f}, {comparison.high:.3f}] {comparison.verdict} "
            f"(noise {comparison.noise:.1%}, MDE {comparison.mde:.1%})"
        )
    for peak in peaks:
        print(
            f"{peak.name:<40} peak {peak.ratio_text} ({peak.baseline_peak / 2**20:.1f} -> "
            f"{peak.candidate_peak / 2**20:.1f} MiB, spread {peak.spread:.1%}) {peak.verdict}"
        )
    print(f"bench_compare: wrote {out / 'report.md'} and {out / 'report.html'}")
    verdicts = [c.verdict for c in comparisons] + [p.verdict for p in peaks]
    return REGRESSION_EXIT if REGRESSION in verdicts else 0


if __name__ == "__main__":
    sys.exit(main())
