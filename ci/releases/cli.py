"""Run the gate on several torch releases and map upstream's known divergences over them.

    python -m ci.releases torch==2.15.0 torch==2.6.0 /wheels/torch-2.13.0a0+fork.whl \\
        [torch==2.13.0=old-run/results.json] [--env gloo4] [--workdir .tox-releases] \\
        [--out release-map] [-- PYTEST_ARGS]

Each requirement gets a tox environment of its own under ``--workdir`` (made once, reused
after), in which ``tox -e ENV`` runs the gate with ``TORCH_UNDER_TEST`` set to it; its report
lands in ``OUT/runs/<name>/``. A second run there (``OUT/runs/<name>/lifted/``) lifts the
skips of the manifest: the tests skip records hold back run, each in a world of its own under
a short deadline, so a hang fixed in a release shows as passing in the map
(``--no-lift-skips`` leaves it out). ``REQUIREMENT=PATH`` takes a results file of an earlier
run instead, and the run of its skips lifted where one lies beside it
(``lifted/results.json``, as this command lays them out). ``--golden-sets DIR`` has every run
load the golden sets under ``DIR`` (a fork's, written by ``python -m ci.gate.golden``) instead
of the committed ones, and the map shows which loads fail in each release. Writes
``release-map.md``, ``.html`` and ``.json`` into ``--out``. The map is the record, not a
verdict: it exits 0 once every run has left a results file, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

from ci.gate.results import GateResults
from ci.gate.target import SUITE_ROOT
from ci.releases import render
from ci.releases.table import release_map
from conformance import golden

LIFT_SKIPS = "--manifest-lift-skips"  # the conformance conftest's option
LIFTED = "lifted"  # the folder, beside a run's results, of its run with skips lifted


def slug(requirement: str) -> str:
    """A folder name for a requirement: ``torch==2.15.0`` -> ``torch-2.15.0``."""
    name = Path(requirement).name if requirement.endswith(".whl") else requirement
    return re.sub(r"[^A-Za-z0-9_.+-]+", "-", name).strip("-")


def _recorded_run(spec: str) -> tuple[str, Path | None]:
    """``REQ=PATH.json`` names an earlier run's results; anything else is a requirement."""
    found = re.fullmatch(r"(?P<requirement>.+?)=(?P<path>[^=]+\.json)", spec)
    if found is None:
        return spec, None
    return found["requirement"], Path(found["path"])


def run_gate(
    requirement: str,
    env: str,
    workdir: Path,
    report: Path,
    pytest_args: list[str],
    golden_sets: Path | None = None,
) -> Path:
    """The gate under ``requirement`` in its own tox environment (loading the golden sets under
    ``golden_sets`` where given); its results file."""
    command = [sys.executable, "-m", "tox", "--workdir", str(workdir / slug(requirement))]
    command += ["-e", env, *(["--", *pytest_args] if pytest_args else [])]
    variables = {"TORCH_UNDER_TEST": requirement, "GATE_REPORT_DIR": str(report)}
    if golden_sets is not None:
        variables[golden.SETS_VARIABLE] = str(golden_sets.resolve())
    print(f"releases: {requirement}: {' '.join(command)}", flush=True)
    subprocess.run(command, cwd=SUITE_ROOT, env={**os.environ, **variables}, check=False)
    return report / "results.json"


def _parse(
    parser: argparse.ArgumentParser, argv: list[str]
) -> tuple[argparse.Namespace, list[str]]:
    """This command's arguments, and pytest's: those after ``--`` (test paths among them,
    which are no requirements) and options this command does not know."""
    split = argv.index("--") if "--" in argv else len(argv)
    args, unknown = parser.parse_known_args(argv[:split])
    return args, [*unknown, *argv[split + 1 :]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ci.releases", description=__doc__.split("\n")[0]
    )
    parser.add_argument("requirements", nargs="+", help="torch requirements, wheels, or REQ=PATH")
    parser.add_argument("--env", default="gloo4", help="the tox env of each run (default gloo4)")
    parser.add_argument("--workdir", type=Path, default=Path(".tox-releases"))
    parser.add_argument("--out", type=Path, default=Path("release-map"))
    parser.add_argument(
        "--golden-sets",
        type=Path,
        help="a directory of golden sets (python -m ci.gate.golden, e.g. a fork's) that every "
        "run loads instead of the committed ones; the map shows which loads fail by release",
    )
    parser.add_argument(
        "--no-lift-skips",
        dest="lift_skips",
        action="store_false",
        help="leave out the second run of each release, of the skip records' tests with their "
        "skips lifted (each in a world of its own, a short deadline each)",
    )
    args, pytest_args = _parse(parser, sys.argv[1:] if argv is None else argv)
    out: Path = args.out.resolve()
    runs: list[tuple[str, GateResults]] = []
    lifted: dict[str, GateResults] = {}
    missing = []
    for spec in args.requirements:
        requirement, recorded = _recorded_run(spec)
        workdir = args.workdir.resolve()
        report = out / "runs" / slug(requirement)
        path = recorded or run_gate(
            requirement, args.env, workdir, report, pytest_args, args.golden_sets
        )
        if path.exists():
            runs.append((requirement, GateResults.load(path)))
        else:
            missing.append(requirement)
        if recorded is not None:
            beside = recorded.parent / LIFTED / "results.json"
            if beside.exists():
                lifted[requirement] = GateResults.load(beside)
        elif args.lift_skips:
            lifted_args = [*pytest_args, LIFT_SKIPS]
            found = run_gate(
                requirement, args.env, workdir, report / LIFTED, lifted_args, args.golden_sets
            )
            if found.exists():
                lifted[requirement] = GateResults.load(found)
            else:
                missing.append(f"{requirement} (skips lifted)")
    table = release_map(runs, lifted)
    out.mkdir(parents=True, exist_ok=True)
    (out / "release-map.md").write_text(render.markdown(table))
    (out / "release-map.html").write_text(render.html(table))
    (out / "release-map.json").write_text(render.as_json(table))
    print(f"releases: {len(runs)} runs mapped into {out / 'release-map.md'}")
    for requirement in missing:
        print(f"releases: {requirement} left no results file", file=sys.stderr)
    return 1 if missing else 0
