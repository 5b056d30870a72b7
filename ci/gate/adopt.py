"""A fork's first manifest, written from a gate run's failures, so its gate starts green.

    python -m ci.gate.adopt gate-report/gloo4/results.json --link URL \
        --out ci/our-known-divergences.toml

Each failing test id (failed or error) is covered by a record (``conformance.divergences``): the
ids of one test function and one matrix cell that fail with the same first line form one
record, under one pattern where a pattern can cover them without covering an id that did not
fail; the first line of the failure is the reason, and ``--link`` (the issue where the fork
tracks its adoption; a manifest takes URLs only) the link, for the maintainer to replace
record by record. Ids cut by a deadline or a crash become ``skip`` records: run again, they
would cost the deadline every time. Pass the file to the gate with ``GATE_MANIFEST=PATH``
(it is applied besides upstream's known divergences), then tighten it record by record.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

from ci.gate.node_ids import function_of
from ci.gate.results import GateResults, TestResult
from conformance.divergences import Divergence, Holding, Unsafe, id_matches, to_toml


def _tests(group: list[TestResult], everything: list[str]) -> tuple[str, ...]:
    """One wildcard pattern for ``group`` (one test function, one cell, one cause) where it
    matches nothing else of the run; else each id itself."""
    function = function_of(group[0].nodeid)
    if len(group) > 1 and "[" in group[0].nodeid:
        pattern = f"{function}[*{group[0].parallelism}*]"
        members = {test.nodeid for test in group}
        if {nodeid for nodeid in everything if id_matches(pattern, nodeid)} == members:
            return (pattern,)
    return tuple(test.nodeid for test in group)


def _unsafe(group: list[TestResult]) -> Unsafe | None:
    """Why a group must not run again: a rank hung or crashed in one of its ids."""
    cut = [test for test in group if test.cut_short]
    if not cut:
        return None
    return "hang" if any("hung" in test.first_failure for test in cut) else "crash"


def divergences(results: GateResults, link: str) -> list[Divergence]:
    """One record for each group of failing ids of ``results``."""
    everything = [test.nodeid for test in results.tests]
    groups: dict[tuple[str, str, str], list[TestResult]] = defaultdict(list)
    for test in results.tests:
        if test.outcome in ("failed", "error"):
            groups[function_of(test.nodeid), test.parallelism, test.cause].append(test)
    return [
        Divergence(
            id=f"adopted-{number}",
            link=link,
            reason=reason,
            holdings=(Holding(tests=_tests(group, everything), skip=_unsafe(group)),),
        )
        for number, ((_, _, reason), group) in enumerate(sorted(groups.items()), start=1)
    ]


def manifest_text(results: GateResults, link: str) -> str:
    target = results.target
    header = (
        f"Known divergences of this fork, adopted from a gate run on torch "
        f"{target.torch_version} (git {target.torch_git_hash}), {target.date}.\n"
        "Give each record an id and link of its own, then tighten its tests."
    )
    return to_toml(divergences(results, link), header=header)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ci.gate.adopt", description=__doc__.split("\n")[0]
    )
    parser.add_argument("results", type=Path, help="a gate run's results.json")
    parser.add_argument("--out", type=Path, required=True, help="the manifest to write")
    parser.add_argument(
        "--link", required=True, help="URL of the issue that tracks the adopted divergences"
    )
    args = parser.parse_args(argv)
    results = GateResults.load(args.results)
    args.out.write_text(manifest_text(results, args.link))
    count = len(divergences(results, args.link))
    print(f"adopt: wrote {count} records to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
