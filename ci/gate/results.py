"""The gate's machine-readable results: one record per test id, the target, the manifests.

The pytest plugin in ``_recorder`` writes them as JSON; the reports are rendered from that
file alone, so a report can be remade (or two runs compared) without torch installed.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ci.gate.target import ExecutionTarget
from harness.outcomes import OUTCOMES, Outcome, is_failure

# A world test's first failure: "rank 1 failed: ...", "rank 0 hung: ...", "rank 2 crashed: ..."
_RANK_STATUS = re.compile(r"^rank \d+ (?P<status>\w+): (?P<text>.*)")
NO_PARALLELISM = "other"  # test ids that name no parallelism: utilities, single process
NO_RESULTS_EXIT = 3  # the gate's exit status where pytest exited 0 but wrote no results


@dataclass(frozen=True)
class TestResult:
    """How one test id ended, and what a reader needs to act on it."""

    __test__ = False  # not a pytest test class

    nodeid: str
    outcome: Outcome
    duration_s: float
    check: str  # the test module, without ``test_``: what is being checked
    parallelism: str  # the matrix cell named in the id, or NO_PARALLELISM
    world_size: int | None  # None for tests that run in the controller alone
    failing_ranks: tuple[int, ...] = ()
    first_failure: str = ""  # the lowest failing rank's exception: key path and values
    reason: str = ""  # why it was skipped or is expected to fail
    rerun: str = ""  # the command that reruns this test id alone

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"{self.nodeid}: outcome must be one of {OUTCOMES}")

    @property
    def is_failure(self) -> bool:
        return is_failure(self.outcome)

    @property
    def cause(self) -> str:
        """The first line of the failure without the rank that saw it ("failed: KeyError ...",
        "hung: did not finish ..."): ids that share it share a cause."""
        first = (self.first_failure.splitlines() or [f"{self.outcome} without a message"])[0]
        found = _RANK_STATUS.match(first)
        return f"{found['status']}: {found['text']}" if found else first

    @property
    def cut_short(self) -> bool:
        """Whether a rank hung or crashed: run again, it would cost its deadline again."""
        found = _RANK_STATUS.match(self.first_failure)
        return found is not None and found["status"] in ("hung", "crashed")


def count_by_parallelism_and_size(
    cells: Iterable[tuple[str, int]],
) -> dict[str, dict[int, int]]:
    """How many of ``cells`` (parallelism, world size) there are, by parallelism then size."""
    nested: dict[str, dict[int, int]] = {}
    for (parallelism, size), count in sorted(Counter(cells).items()):
        nested.setdefault(parallelism, {})[size] = count
    return nested


@dataclass(frozen=True)
class UnusedEntry:
    """A manifest record that matched no collected test: stale, or a typo in its tests."""

    source: str  # file#id
    pattern: str  # its tests, space-separated


@dataclass(frozen=True)
class ReleaseResolution:
    """How the build's version resolved against the known divergences' recorded releases."""

    release: str  # e.g. 2.15.0 for 2.15.0a0+gitabc
    recorded: bool
    newest_recorded: str
    inferred: tuple[str, ...] = ()  # "source: tests" of each record applied by its range alone
    predates_the_suite: bool = False  # older than every recorded release
    lies_between: str = ""  # "2.8.0 and 2.13.0": the recorded releases around an unrecorded one

    def describe(self) -> str:
        if self.recorded:
            return f"release {self.release}, recorded"
        if self.predates_the_suite:
            return (
                f"release {self.release} predates the oldest release this suite serves: "
                "failures may be the suite's own"
            )
        where = (
            f"between recorded {self.lies_between}"
            if self.lies_between
            else f"newest recorded: {self.newest_recorded}"
        )
        return (
            f"release {self.release} is not recorded ({where}): "
            f"{len(self.inferred)} known divergences inferred from their release ranges"
        )


@dataclass
class GateResults:
    """Everything one gate run found."""

    target: ExecutionTarget
    exit_status: int
    duration_s: float
    manifests: list[str] = field(default_factory=list)
    unused_entries: list[UnusedEntry] = field(default_factory=list)
    release: ReleaseResolution | None = None  # None where the suite applied no manifest
    tests: list[TestResult] = field(default_factory=list)
    # Ids not collected because their cell does not exist at their world size, counted by
    # parallelism, then world size.
    not_applicable: dict[str, dict[int, int]] = field(default_factory=dict)
    tier: str = "whole"  # which ids the gate ran: "whole", a tier of ci.gate.tier, or "changed"

    @property
    def failures(self) -> list[TestResult]:
        return [test for test in self.tests if test.is_failure]

    def totals(self) -> Counter[str]:
        return Counter(test.outcome for test in self.tests)

    def matrix(self) -> dict[str, dict[str, Counter[str]]]:
        """Outcome counts by parallelism, then by check; parallelisms and checks sorted."""
        cells: dict[str, dict[str, Counter[str]]] = {}
        for test in sorted(self.tests, key=lambda t: (t.parallelism, t.check)):
            cells.setdefault(test.parallelism, {}).setdefault(test.check, Counter())[
                test.outcome
            ] += 1
        return cells

    def cells(self) -> dict[str, dict[int, int]]:
        """Test ids run by parallelism, then world size (ids run in the controller alone are
        left out); parallelisms and sizes sorted."""
        return count_by_parallelism_and_size(
            (test.parallelism, test.world_size) for test in self.tests if test.world_size
        )

    def checks(self) -> list[str]:
        return sorted({test.check for test in self.tests})

    def save(self, path: Path) -> None:
        data = {
            "target": self.target.to_json(),
            "exit_status": self.exit_status,
            "duration_s": self.duration_s,
            "manifests": self.manifests,
            "unused_entries": [asdict(entry) for entry in self.unused_entries],
            "release": asdict(self.release) if self.release else None,
            "tests": [asdict(test) for test in self.tests],
            "not_applicable": self.not_applicable,
            "tier": self.tier,
        }
        path.write_text(json.dumps(data, indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> GateResults:
        data: dict[str, Any] = json.loads(path.read_text())
        return cls(
            target=ExecutionTarget.from_json(data["target"]),
            exit_status=data["exit_status"],
            duration_s=data["duration_s"],
            manifests=data["manifests"],
            unused_entries=[UnusedEntry(**entry) for entry in data["unused_entries"]],
            release=_release(data.get("release")),
            tests=[
                TestResult(**{**test, "failing_ranks": tuple(test["failing_ranks"])})
                for test in data["tests"]
            ],
            not_applicable={
                parallelism: {int(size): count for size, count in by_size.items()}
                for parallelism, by_size in data.get("not_applicable", {}).items()
            },
            tier=data.get("tier", "whole"),
        )


def _release(data: dict[str, Any] | None) -> ReleaseResolution | None:
    if data is None:
        return None
    return ReleaseResolution(**{**data, "inferred": tuple(data["inferred"])})
