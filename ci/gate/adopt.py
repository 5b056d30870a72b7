"""A fork's first manifest, written from a gate run's failures, so its gate starts green.

    python -m ci.gate.adopt gate-report/gloo4/results.json --out ci/our-known-divergences.txt

Each failing test id (failed or error) becomes an entry: the ids of one test function and
one matrix cell that fail with the same first line share one pattern where a pattern can
cover them without covering an id that did not fail; the first line of the failure is the
reason, and the link is ``TODO``, for the maintainer to replace with the issue that tracks
it. Ids cut by a deadline or a crash become ``skip`` entries: run again, they would cost the
deadline every time. Pass the file to the gate with ``GATE_MANIFEST=PATH`` (it is applied
besides upstream's known divergences), then tighten it entry by entry.
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
from collections import defaultdict
from pathlib import Path

from ci.gate.results import GateResults, TestResult

PLACEHOLDER_LINK = "TODO"


def escaped(nodeid: str) -> str:
    """``nodeid`` as an fnmatch pattern that matches it alone (brackets taken literally)."""
    return "".join("[[]" if c == "[" else "[]]" if c == "]" else c for c in nodeid)


def _group_pattern(tests: list[TestResult], everything: list[str]) -> list[str]:
    """One wildcard pattern for ``tests`` (one test function, one cell, one cause) where it
    matches nothing else of the run; else each id's own pattern."""
    function = tests[0].nodeid.split("[", 1)[0]
    cell = tests[0].parallelism
    if len(tests) > 1 and "[" in tests[0].nodeid:
        pattern = f"{escaped(function)}[[]*{cell}*[]]"
        members = {test.nodeid for test in tests}
        if {nodeid for nodeid in everything if fnmatch.fnmatchcase(nodeid, pattern)} == members:
            return [pattern]
    return [escaped(test.nodeid) for test in tests]


def entries(results: GateResults) -> list[str]:
    """The manifest lines for every failing id of ``results``."""
    everything = [test.nodeid for test in results.tests]
    groups: dict[tuple[str, str, str], list[TestResult]] = defaultdict(list)
    for test in results.tests:
        if test.outcome in ("failed", "error"):
            groups[test.nodeid.split("[", 1)[0], test.parallelism, test.cause].append(test)
    lines = []
    for (_, _, reason), tests in sorted(groups.items()):
        kind = "skip | " if any(test.cut_short for test in tests) else ""
        clean = reason.replace("|", "/")
        for pattern in _group_pattern(tests, everything):
            lines.append(f"{kind}{pattern} | {clean} | {PLACEHOLDER_LINK}")
    return lines


def manifest_text(results: GateResults) -> str:
    target = results.target
    return (
        "\n".join(
            [
                f"# Known divergences of this fork, adopted from a gate run on torch "
                f"{target.torch_version} (git {target.torch_git_hash}), {target.date}.",
                f"# Replace each {PLACEHOLDER_LINK} with the issue that tracks it.",
                "# pattern | reason | link",
                *entries(results),
            ]
        )
        + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ci.gate.adopt", description=__doc__.split("\n")[0]
    )
    parser.add_argument("results", type=Path, help="a gate run's results.json")
    parser.add_argument("--out", type=Path, required=True, help="the manifest to write")
    args = parser.parse_args(argv)
    results = GateResults.load(args.results)
    text = manifest_text(results)
    args.out.write_text(text)
    count = sum(1 for line in text.splitlines() if not line.startswith("#"))
    print(f"adopt: wrote {count} entries to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
