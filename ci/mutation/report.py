"""The mutation report: each mutant's status and killing test, as JSON and Markdown."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final, Literal

MutantStatus = Literal[
    "killed", "survived", "timed out", "equivalent", "absent", "error", "unverified"
]
KILLED: Final = "killed"  # a test failed against the mutant, and passes without it
SURVIVED: Final = "survived"  # every selected test passed
TIMED_OUT: Final = "timed out"  # the run hit --run-timeout
EQUIVALENT: Final = "equivalent"  # the catalogue argues no test on the gate's worlds can see it
ABSENT: Final = "absent"  # the torch under test has no target to break (an older release)
ERROR: Final = "error"  # pytest failed without a failing test, or the mutant's own code raised
UNVERIFIED: Final = "unverified"  # the killing test fails without the mutant too


@dataclass
class MutantOutcome:
    """What the suite made of one mutant. ``detail``: the killing test's message, the
    equivalence argument, or what went wrong."""

    name: str
    upstream: str
    bug: str
    status: MutantStatus
    killed_by: str | None = None
    detail: str = ""
    seconds: float = 0.0
    # Whether its killing test is one of the gate's quick tier (None: no killing test).
    in_quick_tier: bool | None = None


# Whether the gate's quick tier holds the killing test, as the report's column shows it.
QUICK_TIER_CELL = {True: "kills it", False: "killer not in it", None: "-"}


def kill_rate(outcomes: list[MutantOutcome]) -> tuple[int, int]:
    """Killed mutants, and the mutants that are neither equivalent nor absent from the build."""
    counted = [o for o in outcomes if o.status not in (EQUIVALENT, ABSENT)]
    return sum(o.status == KILLED for o in counted), len(counted)


def write(outcomes: list[MutantOutcome], settings: str, out: Path) -> Path:
    """Write ``mutation.json`` and ``mutation.md`` into ``out``; return the Markdown's path."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "mutation.json").write_text(json.dumps([asdict(o) for o in outcomes], indent=1))
    markdown = out / "mutation.md"
    markdown.write_text(markdown_report(outcomes, settings))
    return markdown


def markdown_report(outcomes: list[MutantOutcome], settings: str) -> str:
    killed, counted = kill_rate(outcomes)
    rate = f"{100 * killed / counted:.1f}%" if counted else "n/a"
    absent = sum(o.status == ABSENT for o in outcomes)
    uncounted = f" ({absent} absent from this build, not counted)" if absent else ""
    statuses = ", ".join(
        f"{n} {status}" for status, n in sorted(Counter(o.status for o in outcomes).items())
    )
    lines = [
        "# Mutation report",
        "",
        f"{settings}",
        "",
        f"**Kill rate: {killed} of {counted} non-equivalent mutants{uncounted} ({rate}).** "
        f"{len(outcomes)} mutants: {statuses}.",
        "",
    ]
    for upstream in sorted({o.upstream for o in outcomes}):
        lines += [
            f"## `{upstream}`",
            "",
            "| mutant | bug | status | killed by / why | quick tier | s |",
            "| --- | --- | --- | --- | --- | ---: |",
        ]
        for o in (o for o in outcomes if o.upstream == upstream):
            why = f"`{o.killed_by}`: {o.detail}" if o.killed_by else o.detail
            quick = QUICK_TIER_CELL[o.in_quick_tier]
            lines.append(
                f"| `{o.name}` | {o.bug} | {o.status} | {_cell(why)} | {quick} | {o.seconds:.0f} |"
            )
        lines.append("")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
