"""How much one build's benchmarks vary from process to process, under given levers.

    python -m ci.bench.noise [--python P] [--runs 8] [--env KEY=VALUE] [--wrap "setarch -R"]
        [--out bench-noise] [-- BENCHMARK PYTEST ARGS]

Runs the state-dict benchmarks ``--runs`` times in fresh processes, one after another, and
prints, per benchmark, the spread between runs (standard deviation of the log of each run's
time, its median round, as the comparison takes it) beside the spread of rounds within a
run, and the part of the between-run spread that is one factor shared by every benchmark of a
run (a run that is slow everywhere). This is the noise a comparison of runs one after another
would face; ``ci.bench.compare`` pairs its runs in lockstep, which cancels what a pair's runs
share. Each lever of ``ci/bench/sample-report/README.md``'s noise table was measured with it.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ci.bench.runs import Build, Timings, env_pairs, read_timings, run_benchmarks
from ci.bench.stats import log_run_times

MIN_SECONDS = 1e-3  # the summary covers benchmarks whose run time is at least this


@dataclass(frozen=True)
class Spread:
    """One benchmark's noise over runs of one build, as fractions (log-scale deviations)."""

    name: str
    run_time_s: float  # the median over runs of a run's time (its median round)
    between_runs: float  # std of log run times
    within_run: float  # median over runs of the std of log rounds
    between_without_shared: float  # between_runs once each run's shared factor is removed


def spreads(runs: list[Timings]) -> list[Spread]:
    """Each benchmark's spread over ``runs`` (at least two, every benchmark in each)."""
    if len(runs) < 2:
        raise ValueError("a spread between runs needs at least two runs")
    names = sorted(runs[0])
    logs = np.array(
        [log_run_times(tuple(tuple(run[name]) for run in runs)) for name in names]
    ).T  # runs x names
    centred = logs - logs.mean(axis=0)
    shared = np.median(centred, axis=1, keepdims=True)  # each run's factor on every benchmark
    return [
        Spread(
            name=name,
            run_time_s=float(np.exp(np.median(logs[:, index]))),
            between_runs=float(np.std(logs[:, index], ddof=1)),
            within_run=float(np.median([np.std(np.log(run[name]), ddof=1) for run in runs])),
            between_without_shared=float(np.std(centred[:, index] - shared[:, 0], ddof=1)),
        )
        for index, name in enumerate(names)
    ]


def summary(found: list[Spread]) -> dict[str, float]:
    """Medians over the benchmarks of at least ``MIN_SECONDS``."""
    timed = [spread for spread in found if spread.run_time_s >= MIN_SECONDS]
    if not timed:
        raise ValueError(f"no benchmark took {MIN_SECONDS * 1e3:g} ms or more")
    return {
        "benchmarks": len(timed),
        "between_runs": float(np.median([s.between_runs for s in timed])),
        "within_run": float(np.median([s.within_run for s in timed])),
        "between_without_shared": float(np.median([s.between_without_shared for s in timed])),
    }


def _table(found: list[Spread], overall: dict[str, float]) -> str:
    lines = [f"{'benchmark':<40} {'run time':>10} {'between':>8} {'within':>8} {'unshared':>8}"]
    for spread in found:
        lines.append(
            f"{spread.name:<40} {spread.run_time_s * 1e3:>8.2f}ms {spread.between_runs:>8.1%} "
            f"{spread.within_run:>8.1%} {spread.between_without_shared:>8.1%}"
        )
    lines.append(
        f"median over the {overall['benchmarks']:g} benchmarks of >= {MIN_SECONDS * 1e3:g} ms: "
        f"between runs {overall['between_runs']:.1%}, within a run {overall['within_run']:.1%}, "
        f"between runs without the shared factor {overall['between_without_shared']:.1%}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ci.bench.noise", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--runs", type=int, default=8, help="fresh processes (default 8)")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--wrap", default="", help="a command each run runs under")
    parser.add_argument("--out", type=Path, default=Path("bench-noise"))
    parser.add_argument("pytest_args", nargs="*", help="after --: arguments for the benchmarks")
    args = parser.parse_args(argv)
    build = Build("noise", args.python, env_pairs(args.env), tuple(shlex.split(args.wrap)))
    out: Path = args.out.resolve()
    runs = []
    for run in range(-1, args.runs):  # one unrecorded warm-up run: file caches, imports
        print(f"bench_noise: run {run + 1}/{args.runs}", flush=True)
        raw = run_benchmarks(build, f"warmup{-run}" if run < 0 else str(run), out, args.pytest_args)
        if run >= 0:
            runs.append(read_timings(raw)[0])
    found = spreads(runs)
    overall = summary(found)
    print(_table(found, overall))
    record = {"build": asdict(build), "runs": args.runs, "pytest_args": args.pytest_args}
    record |= {"summary": overall, "spreads": [asdict(spread) for spread in found]}
    (out / "noise.json").write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
