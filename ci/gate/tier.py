"""``python -m ci.gate.tier``: the quick tier, the gate's subset for every commit.

The tier is computed, never chosen by hand. Its inputs: the ids the suite collects at world
sizes 1, 2 and 4; the coverage map of the tier's release (``ci/gate/coverage-maps/``, made
by ``python -m ci.gate.coverage``), which says what each id executes of torch's state-dict
and checkpoint code; the mutation report (``ci/mutation/sample-report/mutation.json``); and
the recorded mean durations (``ci/gate/mean-durations.json``). The tier keeps every mutant's
killing test, then adds ids until it executes every arc (line and branch) that the whole
gate executes, greedily by arcs per recorded second. Last it keeps the cheapest test of every
check module, of every cell, and of every pair of a family of checks
(``conformance.checks.FAMILIES``) and a family of cells that it still lacks. Written to
``ci/gate/quick-tier.txt``; ``tests/test_quick_tier.py`` fails when that file is stale.

    python -m ci.gate.tier            # rewrite ci/gate/quick-tier.txt
    python -m ci.gate.tier --check    # exit 1 if it is stale
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ci.gate.coverage import TIER_RELEASE, map_path
from ci.gate.coverage.cover import Executed, cover
from ci.gate.coverage.map import load
from ci.gate.durations import MEANS, weight_key
from ci.gate.node_ids import module_of, parallelisms_of, world_size_of
from ci.gate.target import SUITE_ROOT

QUICK_TIER = Path(__file__).parent / "quick-tier.txt"
MUTATION_REPORT = SUITE_ROOT / "ci" / "mutation" / "sample-report" / "mutation.json"
WORLD_SIZES = "1,2,4"
UNKNOWN_DURATION_S = 5.0  # a test the recorded durations lack: neither cheap nor dear
MIN_COST_S = 0.05  # what any id costs at least: the harness's own work around its body
NO_CELL = "no cell"  # the family of cells of an id that names no cell


def _in_module(module: str) -> Callable[[str], bool]:
    return lambda nodeid: module_of(nodeid) == module


def _of_cell(cell: str) -> Callable[[str], bool]:
    return lambda nodeid: cell in parallelisms_of(nodeid, [cell])


def cost(nodeid: str, durations: Mapping[str, float]) -> float:
    """An id's recorded mean duration (of its function at its world size), in seconds."""
    return max(durations.get(weight_key(nodeid), UNKNOWN_DURATION_S), MIN_COST_S)


@dataclass(frozen=True)
class Inputs:
    """What the tier is computed from."""

    ids: list[str]  # the ids the suite collects
    killers: dict[str, str]  # mutant -> the id that kills it
    durations: Mapping[str, float]  # mean durations, keyed as ci.gate.durations weighs ids
    cell_families: Mapping[str, str]  # each cell's family
    check_families: Mapping[str, tuple[str, ...]]  # each family of checks' modules
    executed: Executed  # what each id executes of torch's measured code


def pair_of(nodeid: str, inputs: Inputs) -> tuple[str, str]:
    """An id's family of checks and family of cells (``NO_CELL`` for an id naming none)."""
    module = module_of(nodeid)
    checks = next(
        (family for family, modules in inputs.check_families.items() if module in modules),
        None,
    )
    if checks is None:
        raise ValueError(f"check module {module} is in no family of conformance.checks.FAMILIES")
    cells = parallelisms_of(nodeid, inputs.cell_families)
    return checks, inputs.cell_families[cells[0]] if cells else NO_CELL


def select(inputs: Inputs) -> list[str]:
    """The quick tier: every killer, a cover of every arc the whole gate executes, then the
    cheapest id of every check module, cell and (checks, cells) pair the tier still lacks."""
    collected = set(inputs.ids)
    lost = {mutant: nodeid for mutant, nodeid in inputs.killers.items() if nodeid not in collected}
    if lost:
        raise ValueError(
            "the suite no longer collects these mutants' killers; rerun python -m ci.mutation: "
            + ", ".join(f"{mutant} ({nodeid})" for mutant, nodeid in sorted(lost.items()))
        )
    chosen = set(inputs.killers.values())
    pairs: dict[tuple[str, str], list[str]] = {}
    for nodeid in inputs.ids:
        pairs.setdefault(pair_of(nodeid, inputs), []).append(nodeid)

    def price(nodeid: str) -> float:
        return cost(nodeid, inputs.durations)

    chosen.update(cover(inputs.ids, inputs.executed, chosen, price))  # every arc of the gate
    ranked = sorted(inputs.ids, key=lambda nodeid: (price(nodeid), world_size_of(nodeid), nodeid))

    def keep_one(wanted: Callable[[str], bool]) -> None:
        if not any(wanted(nodeid) for nodeid in chosen):
            first = next((nodeid for nodeid in ranked if wanted(nodeid)), None)
            if first is not None:
                chosen.add(first)

    for module in sorted({module_of(nodeid) for nodeid in inputs.ids}):
        keep_one(_in_module(module))
    for cell in sorted(inputs.cell_families):
        keep_one(_of_cell(cell))
    for _, members in sorted(pairs.items()):
        keep_one(set(members).__contains__)
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


def tier_text(chosen: list[str], durations: Mapping[str, float], of: int, release: str) -> str:
    estimate = sum(cost(nodeid, durations) for nodeid in chosen)
    header = (
        f"# The quick tier: {len(chosen)} of the {of} ids the suite collects at world sizes "
        f"{WORLD_SIZES}, about {estimate / 60:.1f} min of recorded test time.\n"
        f"# Generated by python -m ci.gate.tier from torch {release}'s coverage map, the\n"
        "# mutation report and the recorded durations; do not edit. python -m ci.gate --tier\n"
        "# quick runs it.\n"
    )
    return header + "".join(f"{nodeid}\n" for nodeid in chosen)


def quick_tier_ids(path: Path = QUICK_TIER) -> list[str]:
    """The ids of a tier file."""
    return [line for line in path.read_text().splitlines() if line and not line.startswith("#")]


def fresh_text(ids: list[str]) -> str:
    """What ``quick-tier.txt`` holds for the suite's ``ids`` and the committed inputs."""
    from conformance.cells import families
    from conformance.checks import FAMILIES

    coverage = load(map_path(TIER_RELEASE))
    durations: dict[str, float] = json.loads(MEANS.read_text())
    inputs = Inputs(
        ids=ids,
        killers=killers_of(MUTATION_REPORT),
        durations=durations,
        cell_families=families(),
        check_families=FAMILIES,
        executed=Executed.of(coverage),
    )
    return tier_text(select(inputs), durations, len(ids), TIER_RELEASE)


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
