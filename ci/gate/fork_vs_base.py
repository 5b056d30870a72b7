"""A fork judged against the release it is built on: which failures are the fork's own.

    python -m ci.gate.fork_vs_base BASE/results.json FORK/results.json [--out DIR]

Both files are gate results (``python -m ci.gate``) of the same suite: one of the base
release, one of the fork. Each test id run by both lands in one class: the fork's own
failures (failing on the fork, passing on the base), what the fork fixed (failing on the
base, passing on the fork), failures they share, and ids that pass on both. Writes
``fork-vs-base.md`` and ``fork-vs-base.json``; exits 1 when the fork has failures of its
own, 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from ci.gate.report_markdown import table
from ci.gate.results import GateResults
from harness.outcomes import Outcome

Verdict = Literal["fork_failure", "fixed_by_fork", "shared_failure", "passing", "not_compared"]
# A test id "fails" when its behaviour failed, expected or not: a fork's own bug that the
# manifest happens to expect still differs from the base where the base passes.
_FAILING: frozenset[Outcome] = frozenset({"failed", "error", "xfailed"})
_PASSING: frozenset[Outcome] = frozenset({"passed", "xpassed"})


@dataclass(frozen=True)
class Difference:
    """One test id, its outcome on each side, and the fork's first failure where it has one."""

    nodeid: str
    base: Outcome | None
    fork: Outcome | None
    first_failure: str = ""


@dataclass
class Comparison:
    """Every test id of either run, by verdict."""

    base_torch: str
    fork_torch: str
    by_verdict: dict[Verdict, list[Difference]] = field(default_factory=dict)

    @property
    def fork_failures(self) -> list[Difference]:
        return self.by_verdict.get("fork_failure", [])


def verdict(base: Outcome | None, fork: Outcome | None) -> Verdict:
    """The class of one test id from its outcome on each side (None: not run there)."""
    if base is None or fork is None or "skipped" in (base, fork):
        return "not_compared"
    if fork in _FAILING:
        return "shared_failure" if base in _FAILING else "fork_failure"
    return "fixed_by_fork" if base in _FAILING else "passing"


def compare(base: GateResults, fork: GateResults) -> Comparison:
    """The fork's run against the base's, test id by test id."""
    base_tests = {test.nodeid: test for test in base.tests}
    fork_tests = {test.nodeid: test for test in fork.tests}
    comparison = Comparison(base.target.torch_version, fork.target.torch_version)
    for nodeid in sorted(base_tests.keys() | fork_tests.keys()):
        theirs, ours = base_tests.get(nodeid), fork_tests.get(nodeid)
        difference = Difference(
            nodeid,
            theirs.outcome if theirs else None,
            ours.outcome if ours else None,
            ours.first_failure if ours else "",
        )
        comparison.by_verdict.setdefault(verdict(difference.base, difference.fork), []).append(
            difference
        )
    return comparison


_HEADINGS: dict[Verdict, str] = {
    "fork_failure": "The fork's own failures (fail on the fork, pass on the base)",
    "fixed_by_fork": "Fixed by the fork (fail on the base, pass on the fork)",
    "shared_failure": "Shared failures (fail on both)",
    "not_compared": "Not compared (skipped or not run on one side)",
}


def _rows(differences: Iterable[Difference]) -> list[str]:
    return table(
        ["test id", "base", "fork", "fork's first failure"],
        [
            [
                f"`{d.nodeid}`",
                d.base or "-",
                d.fork or "-",
                (d.first_failure.splitlines() or [""])[0],
            ]
            for d in differences
        ],
    )


def markdown(comparison: Comparison) -> str:
    counts = {name: len(items) for name, items in comparison.by_verdict.items()}
    title = (
        f"FAILED: {len(comparison.fork_failures)} failures of the fork's own"
        if comparison.fork_failures
        else "PASSED: no failure of the fork's own"
    )
    lines = [
        f"# Fork against base: {title}",
        "",
        f"Base torch {comparison.base_torch}; fork torch {comparison.fork_torch}.",
        "",
        *table(["verdict", "test ids"], [[name, str(n)] for name, n in sorted(counts.items())]),
    ]
    for name, heading in _HEADINGS.items():
        items = comparison.by_verdict.get(name, [])
        if items and name != "not_compared":
            lines += ["", f"## {heading}: {len(items)}", "", *_rows(items)]
        elif items:
            lines += ["", f"## {heading}: {len(items)}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ci.gate.fork_vs_base", description=__doc__.split("\n")[0]
    )
    parser.add_argument("base", type=Path, help="the base release's results.json")
    parser.add_argument("fork", type=Path, help="the fork's results.json")
    parser.add_argument("--out", type=Path, default=Path("fork-vs-base"))
    args = parser.parse_args(argv)
    comparison = compare(GateResults.load(args.base), GateResults.load(args.fork))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fork-vs-base.md").write_text(markdown(comparison))
    data = {
        "base_torch": comparison.base_torch,
        "fork_torch": comparison.fork_torch,
        "by_verdict": {k: [asdict(d) for d in v] for k, v in comparison.by_verdict.items()},
    }
    (args.out / "fork-vs-base.json").write_text(json.dumps(data, indent=1) + "\n")
    counts = ", ".join(f"{len(v)} {k}" for k, v in sorted(comparison.by_verdict.items()))
    print(f"fork_vs_base: {counts}; wrote {args.out / 'fork-vs-base.md'}")
    return 1 if comparison.fork_failures else 0


if __name__ == "__main__":
    sys.exit(main())
