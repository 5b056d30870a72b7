"""``python -m ci.gate.tier``: the quick tier, the gate's subset for every commit.

The tier is computed, never chosen by hand, from three inputs: the ids the suite collects at
world sizes 1, 2 and 4; the mutation report (``ci/mutation/sample-report/mutation.json``),
whose every mutant's killing test the tier keeps, so that it kills every mutant the whole
gate kills; and the recorded durations (``ci/gate/durations.json``), by which it picks the
cheapest test wherever it needs one. Beside the killers it keeps one test of every check
module, of every parallelism of the matrix, and of every contract
(``conformance.checks.CONTRACTS``) in every family of cells (each cell's descriptor names
its family). Written to ``ci/gate/quick-tier.txt``;
``tests/test_quick_tier.py`` fails when that file is stale.

    python -m ci.gate.tier            # rewrite ci/gate/quick-tier.txt
    python -m ci.gate.tier --check    # exit 1 if it is stale
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from ci.gate.durations import RECORDED
from ci.gate.node_ids import function_of, module_of, parallelisms_of, world_size_of
from ci.gate.target import SUITE_ROOT

QUICK_TIER = Path(__file__).parent / "quick-tier.txt"
MUTATION_REPORT = SUITE_ROOT / "ci" / "mutation" / "sample-report" / "mutation.json"
WORLD_SIZES = "1,2,4"
UNKNOWN_DURATION_S = 5.0  # a test the recorded durations lack: neither cheap nor dear


def cost(nodeid: str, durations: dict[str, float]) -> tuple[float, int, str]:
    """How dear an id is: its test's recorded duration, then its world size, then the id."""
    duration = durations.get(function_of(nodeid), UNKNOWN_DURATION_S)
    return duration, world_size_of(nodeid), nodeid


Covers = Callable[[str], bool]  # whether an id is one the tier needs one of


def _in_modules(modules: tuple[str, ...]) -> Covers:
    return lambda nodeid: module_of(nodeid) in modules


def _of_cells(parallelisms: list[str], cells: set[str]) -> Covers:
    return lambda nodeid: bool(cells.intersection(parallelisms_of(nodeid, parallelisms)))


def _both(first: Covers, second: Covers) -> Covers:
    return lambda nodeid: first(nodeid) and second(nodeid)


def select(
    ids: list[str],
    killers: dict[str, str],
    durations: dict[str, float],
    families: dict[str, str],
    contracts: dict[str, tuple[str, ...]],
) -> list[str]:
    """The quick tier of ``ids``: every mutant's killer (``killers``: mutant -> id), then the
    cheapest id of each check module, cell and (contract, family of cells) that the tier
    lacks. ``families``: each cell's family; ``contracts``: each contract's modules."""
    collected = set(ids)
    lost = {mutant: nodeid for mutant, nodeid in killers.items() if nodeid not in collected}
    if lost:
        raise ValueError(
            "the suite no longer collects these mutants' killers; rerun python -m ci.mutation: "
            + ", ".join(f"{mutant} ({nodeid})" for mutant, nodeid in sorted(lost.items()))
        )
    chosen = set(killers.values())
    ranked = sorted(ids, key=lambda nodeid: cost(nodeid, durations))

    def keep_one(covers: Covers) -> None:
        if not any(covers(nodeid) for nodeid in chosen):
            first = next((nodeid for nodeid in ranked if covers(nodeid)), None)
            if first is not None:
                chosen.add(first)

    for module in sorted({module_of(nodeid) for nodeid in ids}):
        keep_one(_in_modules((module,)))
    parallelisms = sorted(families)
    for name in parallelisms:
        keep_one(_of_cells(parallelisms, {name}))
    for modules in contracts.values():
        for family in sorted(set(families.values())):
            cells = {name for name in parallelisms if families[name] == family}
            keep_one(_both(_in_modules(modules), _of_cells(parallelisms, cells)))
    return sorted(chosen)


def killers_of(report: Path) -> dict[str, str]:
    """Every mutant the mutation report says was killed (or killed, unverified), and by which
    test; equivalent mutants have none."""
    return {
        entry["name"]: entry["killed_by"]
        for entry in json.loads(report.read_text())
        if entry["status"] in ("killed", "unverified") and entry["killed_by"]
    }


def collected_ids() -> list[str]:
    """The ids the suite collects at ``WORLD_SIZES``."""
    completed = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "conformance", "--collect-only", "-q"),
            *("-p", "no:cacheprovider", "--world-sizes", WORLD_SIZES),
        ],
        cwd=SUITE_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"collecting the suite failed:\n{completed.stdout[-3000:]}")
    return [line for line in completed.stdout.splitlines() if "::" in line]


def tier_text(chosen: list[str], durations: dict[str, float], of: int) -> str:
    estimate = sum(cost(nodeid, durations)[0] for nodeid in chosen)
    header = (
        f"# The quick tier: {len(chosen)} of the {of} ids the suite collects at world sizes "
        f"{WORLD_SIZES}, about {estimate / 60:.1f} min of recorded test time.\n"
        "# Generated by python -m ci.gate.tier from the mutation report and the recorded\n"
        "# durations; do not edit. python -m ci.gate --tier quick runs it.\n"
    )
    return header + "".join(f"{nodeid}\n" for nodeid in chosen)


def quick_tier_ids(path: Path = QUICK_TIER) -> list[str]:
    """The ids of a tier file."""
    return [line for line in path.read_text().splitlines() if line and not line.startswith("#")]


def fresh_text(ids: list[str]) -> str:
    """What ``quick-tier.txt`` holds for the suite's ``ids`` and the committed inputs."""
    from conformance.cells import families
    from conformance.checks import CONTRACTS

    durations: dict[str, float] = json.loads(RECORDED.read_text())
    chosen = select(ids, killers_of(MUTATION_REPORT), durations, families(), CONTRACTS)
    return tier_text(chosen, durations, len(ids))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ci.gate.tier", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    args = parser.parse_args(argv)
    text = fresh_text(collected_ids())
    if args.check:
        stale = not QUICK_TIER.exists() or QUICK_TIER.read_text() != text
        print(f"tier: {QUICK_TIER} is {'stale' if stale else 'fresh'}")
        return 1 if stale else 0
    QUICK_TIER.write_text(text)
    print(f"tier: wrote {QUICK_TIER}: {text.splitlines()[0].removeprefix('# ')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
