"""Run the suite against each mutant of torch's state-dict code and report what it caught.

    python -m ci.mutation [--mutants a,b] [--world-sizes 2,4] [--out mutation-report]

For each mutant of ``ci.mutation.mutants`` (one at a time: each run owns the
machine's cores), the tests most relevant to it run first, with every rank
importing ``ci.mutation.mutants.activate``, and stop at the first failure: the mutant
is killed by that test, survives, or times out (one whose target this build lacks is absent,
and not run). Each killing test is then
run once more without any mutant; one that fails there too proves nothing
and its mutant is reported unverified. Writes ``mutation.json`` and
``mutation.md`` into ``--out``; exits 1 when the kill rate is below
``--target``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ci.gate.node_ids import at_world_sizes
from ci.gate.tier import tier_ids
from ci.mutation import report
from ci.mutation.mutants import Mutant, catalogue, missing_target
from ci.mutation.run import MUTANT_CRASHED, RunResult, RunSettings, run_tests


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ci.mutation", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--mutants", default="", help="comma-separated names (default: all)")
    parser.add_argument(
        "--tests", default="", help="comma-separated tests replacing each mutant's own"
    )
    parser.add_argument(
        "--world-backend", default="gloo", metavar="NAME", help="any the build has (default: gloo)"
    )
    parser.add_argument(
        "--world-device",
        default="auto",
        metavar="TYPE",
        help="device type of the ranks (default: auto)",
    )
    parser.add_argument(
        "--tier",
        choices=("own", "quick"),
        default="own",
        help="own: each mutant's own tests first, then its module's; quick: the gate's quick "
        "tier (ci/gate/quick-tier.txt) at these world sizes, the mutant's modules first",
    )
    parser.add_argument("--world-sizes", default="2,4")
    parser.add_argument("--world-timeout", type=int, default=60, help="seconds per test")
    parser.add_argument("--run-timeout", type=int, default=1200, help="seconds per mutant")
    parser.add_argument("--target", type=float, default=95.0, help="kill rate to reach, percent")
    parser.add_argument("--out", type=Path, default=Path("mutation-report"))
    return parser


def chosen(names: str) -> list[Mutant]:
    mutants = catalogue()
    wanted = [name for name in names.split(",") if name] or list(mutants)
    unknown = sorted(set(wanted) - set(mutants))
    if unknown:
        raise SystemExit(f"unknown mutants {unknown}; known: {sorted(mutants)}")
    return [mutants[name] for name in wanted]


def quick_tier_for(mutant: Mutant, world_sizes: str) -> list[str]:
    """The quick tier's ids at ``world_sizes``, those of the mutant's own tests first."""
    tier = at_world_sizes(tier_ids("quick"), world_sizes)
    own = [nodeid for nodeid in tier if nodeid.startswith(mutant.tests)]
    return own + [nodeid for nodeid in tier if nodeid not in own]


def outcome_of(mutant: Mutant, result: RunResult) -> report.MutantOutcome:
    outcome = report.MutantOutcome(mutant.name, mutant.upstream, mutant.bug, report.SURVIVED)
    outcome.seconds = result.seconds
    if result.failed is not None and result.failed[1].startswith(MUTANT_CRASHED):
        outcome.status, outcome.detail = report.ERROR, f"{result.failed[0]}: {result.failed[1]}"
    elif result.failed is not None:
        outcome.status, (outcome.killed_by, outcome.detail) = report.KILLED, result.failed
    elif result.returncode is None:
        outcome.status, outcome.detail = (
            report.TIMED_OUT,
            f"no failure within the run's limit ({result.log})",
        )
    elif result.returncode != 0:
        outcome.status, outcome.detail = (
            report.ERROR,
            f"pytest exited {result.returncode} with no failing test ({result.log})",
        )
    return outcome


def _unrun(mutant: Mutant) -> report.MutantOutcome | None:
    """The outcome of a mutant not run: absent from the torch under test, or equivalent."""
    missing = missing_target(mutant)
    status: report.MutantStatus
    if missing is not None:
        status, why = report.ABSENT, missing
    elif mutant.equivalent is not None:
        status, why = report.EQUIVALENT, mutant.equivalent
    else:
        return None
    return report.MutantOutcome(mutant.name, mutant.upstream, mutant.bug, status, detail=why)


def verify_killers(outcomes: list[report.MutantOutcome], settings: RunSettings, out: Path) -> None:
    """Mark unverified each kill whose test also fails without any mutant."""
    killers = sorted({o.killed_by for o in outcomes if o.killed_by})
    if not killers:
        return
    result = run_tests(killers, None, settings, out / "baseline", stop_at_first=False)
    failing = {test: f"it fails without the mutant too: {why}" for test, why in result.failures}
    if result.returncode != 0 and not failing:  # cut off or broken: nothing is verified
        why = "timed out" if result.returncode is None else f"exited {result.returncode}"
        failing = dict.fromkeys(killers, f"the run without the mutant {why} ({result.log})")
    for outcome in outcomes:
        if outcome.killed_by in failing:
            outcome.status = report.UNVERIFIED
            outcome.detail = failing[outcome.killed_by]


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    settings = RunSettings(
        args.world_backend,
        args.world_sizes,
        args.world_timeout,
        args.run_timeout,
        args.world_device,
    )
    outcomes = []
    for mutant in chosen(args.mutants):
        unrun = _unrun(mutant)
        if unrun is not None:
            outcomes.append(unrun)
            continue
        tests = [t for t in args.tests.split(",") if t] or (
            quick_tier_for(mutant, args.world_sizes) if args.tier == "quick" else list(mutant.tests)
        )
        outcome = outcome_of(
            mutant, run_tests(tests, mutant.name, settings, args.out / mutant.name)
        )
        print(f"{mutant.name}: {outcome.status} {outcome.killed_by or ''}", flush=True)
        outcomes.append(outcome)
    verify_killers(outcomes, settings, args.out)
    quick = set(tier_ids("quick"))
    for outcome in outcomes:
        if outcome.killed_by:
            outcome.in_quick_tier = outcome.killed_by in quick
    where = f"backend {args.world_backend} on device {args.world_device}"
    where += f", world sizes {args.world_sizes}"
    tier = "the quick tier's tests" if args.tier == "quick" else "each mutant's own tests"
    run = f"Run with `python -m ci.mutation --tier {args.tier}` ({tier}): {where}."
    markdown = report.write(outcomes, run, args.out)
    killed, counted = report.kill_rate(outcomes)
    print(f"{killed}/{counted} non-equivalent mutants this build has killed; report: {markdown}")
    return 0 if counted and 100 * killed / counted >= args.target else 1
