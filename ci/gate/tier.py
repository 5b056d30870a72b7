"""``python -m ci.gate.tier``: the gate's tiers, subsets of its ids chosen by what they execute.

A tier is computed, never chosen by hand. Its inputs: the ids the suite collects at world
sizes 1, 2 and 4; the coverage map of the tier's release (``ci/gate/coverage-maps/``, made
by ``python -m ci.gate.coverage``), which says what each id executes of torch's state-dict
and checkpoint code; the mutation report (``ci/mutation/sample-report/mutation.json``); and
the recorded mean durations (``ci/gate/mean-durations.json``).

- ``quick`` (``ci/gate/quick-tier.txt``), for every commit: every mutant's killing test,
  then ids until it executes every arc (line and branch) that the whole gate executes,
  greedily by arcs per recorded second; last the cheapest test of every check module, of
  every cell, and of every pair of a family of checks (``conformance.checks.FAMILIES``) and a
  family of cells that it still lacks.
- ``families`` (``ci/gate/families-tier.txt``), for pull requests: the quick tier, then, for
  every such pair, ids of the pair until the pair's ids in the tier execute every arc that
  the pair's ids in the whole gate execute (a line a TP check executes is executed by a TP
  check of the tier). An id dearer than ``PAIR_COVER_CAP_S`` is never added for its pair:
  the arcs only such ids execute within their pair are counted in the file's header.

``tests/test_quick_tier.py`` fails when a tier's file is stale.

    python -m ci.gate.tier            # rewrite both files
    python -m ci.gate.tier --check    # exit 1 if either is stale
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal

from ci.gate.coverage import TIER_RELEASE, map_path
from ci.gate.coverage.cover import Executed, cover
from ci.gate.coverage.map import load
from ci.gate.durations import MEANS, weight_key
from ci.gate.node_ids import module_of, parallelisms_of, world_size_of
from ci.gate.target import SUITE_ROOT

Tier = Literal["quick", "families"]
TIER_FILES: dict[Tier, Path] = {
    "quick": Path(__file__).parent / "quick-tier.txt",
    "families": Path(__file__).parent / "families-tier.txt",
}
PAIR_COVER_CAP_S = 60.0  # dearer ids (the 200-save runs) stay out of their pair's cover
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
    price = partial(cost, durations=inputs.durations)

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
    for _, members in sorted(_pairs(inputs).items()):
        keep_one(set(members).__contains__)
    return sorted(chosen)


def _pairs(inputs: Inputs) -> dict[tuple[str, str], list[str]]:
    """The ids of each (family of checks, family of cells) pair."""
    pairs: dict[tuple[str, str], list[str]] = {}
    for nodeid in inputs.ids:
        pairs.setdefault(pair_of(nodeid, inputs), []).append(nodeid)
    return pairs


def select_families(inputs: Inputs, quick: list[str]) -> tuple[list[str], int]:
    """The families tier: ``quick``, then for every (checks, cells) pair a cover of every arc
    the pair's ids execute by ids of the pair, none dearer than ``PAIR_COVER_CAP_S``. Returns
    the tier and the arcs its pairs leave to ids that dear."""
    chosen = set(quick)
    left = 0
    price = partial(cost, durations=inputs.durations)
    for _, members in sorted(_pairs(inputs).items()):
        affordable = [
            nodeid for nodeid in members if price(nodeid) <= PAIR_COVER_CAP_S or nodeid in chosen
        ]
        chosen.update(cover(affordable, inputs.executed, chosen, price))
        unexecuted = inputs.executed.of_ids(members) - inputs.executed.of_ids(
            chosen.intersection(members)
        )
        left += inputs.executed.weight(unexecuted)
    return sorted(chosen), left


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


def tier_text(
    tier: Tier,
    chosen: list[str],
    durations: Mapping[str, float],
    of: int,
    release: str,
    left: int | None = None,
) -> str:
    """A tier's file; ``left``: the arcs a families tier leaves to dear ids."""
    estimate = sum(cost(nodeid, durations) for nodeid in chosen)
    header = (
        f"# The {tier} tier: {len(chosen)} of the {of} ids the suite collects at world sizes "
        f"{WORLD_SIZES}, about {estimate / 60:.1f} min of recorded test time.\n"
    )
    if left is not None:
        header += (
            "# Within each pair of families it executes every arc the pair's ids execute, but "
            f"{left}\n# (summed over pairs) that only ids dearer than {PAIR_COVER_CAP_S:.0f} s "
            "execute there.\n"
        )
    header += (
        f"# Generated by python -m ci.gate.tier from torch {release}'s coverage map, the\n"
        "# mutation report and the recorded durations; do not edit. python -m ci.gate --tier\n"
        f"# {tier} runs it.\n"
    )
    return header + "".join(f"{nodeid}\n" for nodeid in chosen)


def tier_ids(tier: Tier) -> list[str]:
    """The ids of a tier's committed file."""
    text = TIER_FILES[tier].read_text()
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def fresh_texts(ids: list[str]) -> dict[Tier, str]:
    """What each tier's file holds for the suite's ``ids`` and the committed inputs."""
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
    quick = select(inputs)
    wider, left = select_families(inputs, quick)
    return {
        "quick": tier_text("quick", quick, durations, len(ids), TIER_RELEASE),
        "families": tier_text("families", wider, durations, len(ids), TIER_RELEASE, left),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ci.gate.tier", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if a file is stale")
    args = parser.parse_args(argv)
    texts = fresh_texts(collected_ids())
    stale = False
    for tier, text in texts.items():
        path = TIER_FILES[tier]
        if args.check:
            differs = not path.exists() or path.read_text() != text
            stale |= differs
            print(f"tier: {path} is {'stale' if differs else 'fresh'}")
        else:
            path.write_text(text)
            print(f"tier: wrote {path}: {text.splitlines()[0].removeprefix('# ')}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
