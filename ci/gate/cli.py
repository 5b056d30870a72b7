"""The gate's entry point: run the conformance suite, write junit XML, results and reports.

    python -m ci.gate [--world-backend NAME] [--world-device TYPE] --world-sizes 1,2,4 \\
        --out gate-report [--jobs N] [-- PYTEST_ARGS]

writes into ``--out``: ``junit.xml``, ``results.json`` (every test id: outcome, duration,
failing ranks, first difference, rerun command; the execution target), ``report.md`` and
``report.html``. Its exit status is pytest's, or 3 when pytest wrote no results at all. With
``--jobs N`` it runs N pytest sessions side by side and merges them (``ci.gate.jobs``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path

from ci.gate.durations import MEANS, RECORDED
from ci.gate.jobs import auto_jobs, parse_jobs, run_jobs
from ci.gate.node_ids import at_world_sizes, path_of
from ci.gate.report_files import PLOTS, PLOTS_DIR_ENV, write_reports
from ci.gate.results import NO_RESULTS_EXIT, GateResults
from ci.gate.shard import parse_shard
from ci.gate.target import SUITE_ROOT
from ci.gate.tier import TIER_FILES, tier_ids

MANIFEST_ENV = "GATE_MANIFEST"
CHOSEN_TIERS = ("whole", *TIER_FILES)  # --changed-against reports its own


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ci.gate", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--world-backend",
        default="auto",
        metavar="NAME",
        help="any backend the torch build has registered (gloo, nccl, xccl, a vendor's loaded "
        "by HARNESS_PRELOAD); auto: the device type's default (default: auto)",
    )
    parser.add_argument(
        "--world-device",
        default="auto",
        metavar="TYPE",
        help="device type of the ranks; auto: the build's accelerator, else cpu (default: auto)",
    )
    parser.add_argument("--world-sizes", default="1,2,4", help="comma-separated, e.g. 1,2,4")
    parser.add_argument("--out", type=Path, default=Path("gate-report"), help="output folder")
    parser.add_argument(
        "--manifest",
        action="append",
        default=[path for path in os.environ.get(MANIFEST_ENV, "").split(os.pathsep) if path],
        metavar="PATH",
        help="a fork's own known-divergence manifest(s), applied besides upstream's; repeatable "
        f"(default: ${MANIFEST_ENV}, paths separated by {os.pathsep!r})",
    )
    parser.add_argument(
        "--world-require-devices",
        action="store_true",
        help="fail, not skip, worlds without devices",
    )
    parser.add_argument(
        "--manifest-lift-skips",
        action="store_true",
        help="run only the tests that skip records of the manifests hold back, skip lifted, each "
        "in a world of its own under a short deadline; those that pass show as XPASS (fixed)",
    )
    parser.add_argument(
        "--tier",
        choices=CHOSEN_TIERS,
        default="whole",
        help="whole: every test id; quick: the per-commit subset (ci/gate/quick-tier.txt, made "
        "by python -m ci.gate.tier), which kills every mutant and executes every arc the whole "
        "gate executes; families: a superset for pull requests (ci/gate/families-tier.txt), "
        "which executes them within each pair of a family of checks and of cells; also taken "
        "after -- ",
    )
    parser.add_argument(
        "--changed-against",
        metavar="BASE",
        help="run the ids that execute a file the torch under test changed against BASE (a pip "
        "requirement, a wheel, or a directory holding torch/), and the quick tier; a changed "
        "native library or imported file the coverage does not trace runs every id "
        "(changed.md in --out says what ran for each file)",
    )
    parser.add_argument(
        "--gate-shard",
        metavar="K/N",
        help="run the K-th of N parts of the ids, of near-equal recorded time (a module's tests "
        "at one world size kept together); python -m ci.gate.merge joins the N reports",
    )
    parser.add_argument(
        "--jobs",
        default="1",
        metavar="N",
        help="run N pytest sessions side by side on this host, each a part of the ids (as "
        "--gate-shard splits them), their reports merged into one; auto: one per core for CPU "
        "worlds, as memory allows, and 1 for accelerator worlds (default: 1)",
    )
    parser.add_argument(
        "--world-deadlines",
        default=str(RECORDED) if RECORDED.exists() else "",
        metavar="PATH",
        help="deadlines fitted to these recorded durations (ten times, at least 30 s; default: "
        "ci/gate/durations.json); '' gives every world test the harness's 300 s",
    )
    parser.add_argument(
        "--gate-shard-durations",
        default=str(MEANS) if MEANS.exists() else "",
        metavar="PATH",
        help="--gate-shard weighs each id by its function's mean recorded duration in this file "
        "(default: ci/gate/mean-durations.json); '' weighs every id alike",
    )
    parser.add_argument(
        "pytest_args",
        nargs="*",
        help="after --: more pytest arguments; test paths among them replace conformance/",
    )
    parser.set_defaults(selected=None)  # the ids --changed-against chose; None: by --tier
    return parser


def pytest_command(
    args: argparse.Namespace, out: Path, claims: Path | None = None, jobs: int = 1
) -> list[str]:
    """The pytest run of the gate: the suite, the options, and the recorder plugin; with
    ``claims``, one of ``jobs`` jobs that runs the runs of ids it claims in that directory
    first."""
    extra: list[str] = args.pytest_args
    named = [
        arg for arg in extra if not arg.startswith("-") and (SUITE_ROOT / path_of(arg)).exists()
    ]
    tests = named or ["conformance"]
    if args.selected is not None:  # --changed-against chose these ids
        tests = args.selected
    elif args.tier in TIER_FILES:  # the tier's ids at these sizes, of the named paths if any
        tests = [
            nodeid
            for nodeid in at_world_sizes(tier_ids(args.tier), args.world_sizes)
            if not named or nodeid.startswith(tuple(named))
        ]
    options = [arg for arg in extra if arg not in named]
    command = [sys.executable, "-m", "pytest", *tests]
    # Paths go in --option=value form: pytest takes a separate path argument as a test path
    # when it picks the rootdir, and node ids (and manifest patterns) are relative to it.
    command += [f"--world-backend={args.world_backend}", f"--world-device={args.world_device}"]
    command += [f"--world-sizes={args.world_sizes}"]
    command += ["-p", "harness.plugin", "-p", "ci.gate.recorder"]
    command += [f"--junitxml={out / 'junit.xml'}"]
    command += [f"--gate-results={out / 'results.json'}"]
    command += [f"--manifest={Path(manifest).resolve()}" for manifest in args.manifest]
    if args.world_require_devices:
        command.append("--world-require-devices")
    if args.manifest_lift_skips:
        command.append("--manifest-lift-skips")
    if args.world_deadlines:
        command.append(f"--world-deadlines={Path(args.world_deadlines).resolve()}")
    if args.gate_shard or claims:
        command += ["-p", "ci.gate.shard"]
        if args.gate_shard:
            command.append(f"--gate-shard={args.gate_shard}")
        if claims:
            command += [f"--gate-claims={claims}", f"--gate-claim-jobs={jobs}"]
        if args.gate_shard_durations:
            command.append(f"--gate-shard-durations={Path(args.gate_shard_durations).resolve()}")
    return command + options


GATE_OPTIONS_AFTER_SEPARATOR = (
    "--tier",
    "--changed-against",
    "--gate-shard",
    "--jobs",
)  # as `tox -e nccl4 -- --tier quick` passes them


def option_among(name: str, pytest_args: list[str]) -> tuple[str | None, list[str]]:
    """The value of the gate's option ``name`` (``--tier quick`` or ``--tier=quick``) among
    the pytest arguments, and the arguments without it."""
    rest = list(pytest_args)
    for index, arg in enumerate(rest):
        if arg == name and index + 1 < len(rest):
            value = rest[index + 1]
            del rest[index : index + 2]
            return value, rest
        if arg.startswith(f"{name}="):
            del rest[index]
            return arg.partition("=")[2], rest
    return None, rest


def job_count(args: argparse.Namespace) -> int:
    """How many jobs run side by side: ``--jobs``, ``auto`` resolved for the worlds' device
    type (which imports torch); ValueError naming a bad count or backend."""
    count = parse_jobs(args.jobs)
    if count is not None:
        return count
    from harness import devices

    _, device_type = devices.resolve(args.world_backend, args.world_device)
    return auto_jobs(device_type)


def changed_selection(base: str, world_sizes: str, out: Path) -> tuple[list[str] | None, str]:
    """The ids ``--changed-against base`` runs (None: every id) and the tier it reports."""
    from ci.gate import changed
    from harness.coverage import torch_root

    selection = changed.select(
        base, changed.tree_of(base, out / "base"), changed.tree_of_directory(torch_root())
    )
    quick = at_world_sizes(tier_ids("quick"), world_sizes)
    for path in changed.save(selection, out, len(quick)):
        print(f"gate: wrote {path}")
    if selection.whole_gate_because:
        print("gate: every id runs: " + "; ".join(selection.whole_gate_because))
        return None, "changed-whole"
    chosen = sorted({*at_world_sizes(selection.ids, world_sizes), *quick})
    print(f"gate: {len(chosen)} ids run: those that execute a changed file, and the quick tier")
    return chosen, "changed"


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    for name in GATE_OPTIONS_AFTER_SEPARATOR:
        value, args.pytest_args = option_among(name, args.pytest_args)
        if value is not None:
            setattr(args, name.removeprefix("--").replace("-", "_"), value)
    if args.tier not in CHOSEN_TIERS:
        parser.error(f"--tier must be one of {', '.join(CHOSEN_TIERS)}, not {args.tier!r}")
    if args.gate_shard:
        try:
            parse_shard(args.gate_shard)
        except ValueError as error:
            parser.error(str(error))
    try:
        jobs = job_count(args)
    except ValueError as error:
        parser.error(str(error))
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.changed_against:
        args.selected, args.tier = changed_selection(args.changed_against, args.world_sizes, out)
    results_path = out / "results.json"
    results_path.unlink(missing_ok=True)
    shutil.rmtree(out / PLOTS, ignore_errors=True)
    os.environ[PLOTS_DIR_ENV] = str(out / PLOTS)  # the checks' plots, shown by the report
    if jobs == 1:
        status = subprocess.run(pytest_command(args, out), cwd=SUITE_ROOT, check=False).returncode
    else:
        print(f"gate: {jobs} jobs side by side, each writing into {out / 'jobs'}")
        status = run_jobs(partial(pytest_command, args, jobs=jobs), jobs, out, SUITE_ROOT)
    if not results_path.exists():
        print(f"gate: pytest exited with {status} and wrote no results to {out}", file=sys.stderr)
        return status or NO_RESULTS_EXIT
    results = replace(GateResults.load(results_path), tier=args.tier)
    results.save(results_path)
    for path in [out / "junit.xml", results_path, *write_reports(results, out)]:
        print(f"gate: wrote {path}")
    return status
