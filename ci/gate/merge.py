"""``python -m ci.gate.merge DIR... --out OUT``: the reports of N shards as one gate run's.

Each ``DIR`` is the ``--out`` of one ``python -m ci.gate --gate-shard K/N`` run. The merged
``results.json`` holds every shard's test ids (an id in two shards is refused), the slowest
shard's duration (the shards ran side by side), the worst exit status, and what every shard
finds alike from the ids it collects, all of them, before its part is chosen: those not
applicable at their world size, and the manifest records no id matches; ``junit.xml`` holds
every shard's test cases; ``report.md`` and ``report.html`` are made from the merged results.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ElementTree
from dataclasses import replace
from pathlib import Path

from ci.gate.report_files import gather_plots, write_reports
from ci.gate.results import GateResults

JUNIT_COUNTS = ("tests", "failures", "errors", "skipped")


def worst_status(statuses: list[int]) -> int:
    """The exit status of runs side by side: a failing one's, the highest."""
    return max(statuses, key=lambda status: (status != 0, status))


def merged_results(shards: list[GateResults]) -> GateResults:
    """One run's results from its shards' (of the same build, suite and settings)."""
    first = shards[0]
    for other in shards[1:]:
        if other.target.torch_version != first.target.torch_version:
            raise ValueError(
                f"shards of different builds: torch {first.target.torch_version} and "
                f"{other.target.torch_version}"
            )
        if other.target.suite_commit != first.target.suite_commit:
            raise ValueError(
                f"shards of different suites: {first.target.suite_commit} and "
                f"{other.target.suite_commit}"
            )
    seen: dict[str, int] = {}
    for index, shard in enumerate(shards):
        for test in shard.tests:
            if test.nodeid in seen:
                raise ValueError(
                    f"{test.nodeid} ran in shards {seen[test.nodeid] + 1} and {index + 1}"
                )
            seen[test.nodeid] = index
    machines = dict.fromkeys(machine for shard in shards for machine in shard.target.machines)
    return replace(
        first,
        target=replace(first.target, machines=tuple(machines)),
        exit_status=worst_status([shard.exit_status for shard in shards]),
        duration_s=max(shard.duration_s for shard in shards),
        tests=[test for shard in shards for test in shard.tests],
    )


def merged_junit(paths: list[Path]) -> ElementTree.ElementTree:
    """One test suite holding every shard's test cases, its counts and time their sums."""
    suite = ElementTree.Element("testsuite", name="pytest")
    totals = dict.fromkeys(JUNIT_COUNTS, 0)
    time_s = 0.0
    for path in paths:
        for shard_suite in ElementTree.parse(path).getroot().iter("testsuite"):
            for name in JUNIT_COUNTS:
                totals[name] += int(shard_suite.get(name, "0"))
            time_s += float(shard_suite.get("time", "0"))
            suite.extend(shard_suite.findall("testcase"))
    for name, value in totals.items():
        suite.set(name, str(value))
    suite.set("time", f"{time_s:.3f}")
    root = ElementTree.Element("testsuites")
    root.append(suite)
    return ElementTree.ElementTree(root)


def merge_files(directories: list[Path], out: Path, exit_status: int | None = None) -> GateResults:
    """Write the merged ``results.json`` and ``junit.xml`` of the shards in ``directories``
    into ``out``; the merged results, with ``exit_status`` where the caller knows the run's
    (its processes' statuses), else the worst the shards recorded."""
    missing = [d for d in directories if not (d / "results.json").is_file()]
    if missing:
        raise ValueError(f"no results.json in {', '.join(map(str, missing))}")
    results = merged_results([GateResults.load(d / "results.json") for d in directories])
    if exit_status is not None:
        results = replace(results, exit_status=exit_status)
    out.mkdir(parents=True, exist_ok=True)
    results.save(out / "results.json")
    junits = [d / "junit.xml" for d in directories if (d / "junit.xml").is_file()]
    merged_junit(junits).write(out / "junit.xml", encoding="utf-8", xml_declaration=True)
    return results


def merge(directories: list[Path], out: Path) -> GateResults:
    """Write the merged junit XML, results and reports of the shards in ``directories``."""
    results = merge_files(directories, out)
    gather_plots(directories, out)
    write_reports(results, out)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ci.gate.merge", description=__doc__)
    parser.add_argument("shards", nargs="+", type=Path, help="each shard's --out directory")
    parser.add_argument("--out", type=Path, required=True, help="where the merged report goes")
    args = parser.parse_args(argv)
    try:
        results = merge(args.shards, args.out)
    except ValueError as error:
        print(f"merge: {error}", file=sys.stderr)
        return 2
    print(f"merge: {len(results.tests)} test ids of {len(args.shards)} shards in {args.out}")
    return results.exit_status


if __name__ == "__main__":
    sys.exit(main())
