"""The map of upstream's state-dict and checkpoint tests to the checks of this suite.

``conformance/upstream_map.toml`` holds the data: each upstream test function with its status
and the checks that judge what it tests. This module validates it and writes the page people
read, ``conformance/UPSTREAM-MAP.md``, and the counts in ``conformance/README.md``:

    python -m conformance._upstream_map    # rewrite the page and the README's counts

``tests/test_upstream_map.py`` fails when either is stale or an entry names a check that no
longer exists.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from conformance._readme_section import with_section

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

SUITE_DIR = Path(__file__).resolve().parent
MAP = SUITE_DIR / "upstream_map.toml"
PAGE = SUITE_DIR / "UPSTREAM-MAP.md"
README = SUITE_DIR / "README.md"
CHECKS_DIR = SUITE_DIR / "checks"
BEGIN = (
    "<!-- upstream map counts: made by `python -m conformance._upstream_map`; "
    "edit upstream_map.toml -->"
)
END = "<!-- end of upstream map counts -->"

Status = Literal["covered", "partly", "out of scope", "not covered"]
STATUSES: tuple[Status, ...] = get_args(Status)
# What each status must say besides its checks: what a partial cover leaves out, or why none.
_NOTE_FIELD: dict[Status, str | None] = {
    "covered": None,
    "partly": "missing",
    "out of scope": "reason",
    "not covered": "reason",
}


@dataclass(frozen=True)
class UpstreamTest:
    """One upstream test function (``Class.test_name``), its status, the checks that judge what
    it tests (``module.py::test_function`` under ``conformance/``) and what is left out or why.

    A ``partly`` test's ``kept`` says why what it leaves out is left (private internals the
    public effect of which is judged, an accelerator path that skips here naming it, ...); a
    ``partly`` test without one is still open: a check should close it."""

    name: str
    status: Status
    checks: tuple[str, ...]
    note: str
    kept: str = ""


@dataclass(frozen=True)
class UpstreamFile:
    """One upstream test file at the commit it was read at."""

    path: str
    commit: str
    tests: tuple[UpstreamTest, ...]


def _test(entry: dict[str, Any], where: str) -> UpstreamTest:
    name = entry.get("name")
    status = entry.get("status")
    place = f"{where}: {name}"
    if status not in STATUSES:
        raise ValueError(f"{place}: status {status!r} is none of {STATUSES}")
    checks = tuple(entry.get("checks", ()))
    if status in ("covered", "partly") and not checks:
        raise ValueError(f"{place}: {status!r} tests name the checks that judge them")
    if status in ("out of scope", "not covered") and checks:
        raise ValueError(f"{place}: {status!r} tests name no checks")
    field = _NOTE_FIELD[status]
    note = entry.get(field, "") if field else ""
    if field and not note:
        raise ValueError(f"{place}: {status!r} tests say {field!r}")
    allowed = {"name", "status", "checks"} | ({field} if field else set())
    if status == "partly":
        allowed.add("kept")
    if extra := sorted(set(entry) - allowed):
        raise ValueError(f"{place}: unexpected fields {extra} for status {status!r}")
    return UpstreamTest(str(name), status, checks, str(note), str(entry.get("kept", "")))


def load(path: Path = MAP) -> tuple[UpstreamFile, ...]:
    """The map, validated: an entry that breaks its status's rules raises, naming it."""
    data = tomllib.loads(path.read_text())
    files = []
    for file in data["file"]:
        tests = tuple(_test(entry, file["path"]) for entry in file["test"])
        names = [test.name for test in tests]
        if duplicates := sorted({name for name in names if names.count(name) > 1}):
            raise ValueError(f"{file['path']}: tests listed twice: {duplicates}")
        files.append(UpstreamFile(file["path"], file["commit"], tests))
    return tuple(files)


def existing_checks(checks_dir: Path = CHECKS_DIR) -> set[str]:
    """Every ``module.py::test_function`` defined at the top of a test module of the suite."""
    found = set()
    for module in checks_dir.glob("test_*.py"):
        for node in ast.parse(module.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                found.add(f"{module.name}::{node.name}")
    return found


def unknown_checks(files: tuple[UpstreamFile, ...], checks: set[str]) -> list[str]:
    """``upstream file: test -> check`` for each check named that is not among ``checks``."""
    return [
        f"{file.path}: {test.name} -> {check}"
        for file in files
        for test in file.tests
        for check in test.checks
        if check not in checks
    ]


def counts(files: tuple[UpstreamFile, ...]) -> Counter[str]:
    return Counter(test.status for file in files for test in file.tests)


def open_partly(files: tuple[UpstreamFile, ...]) -> int:
    """How many ``partly`` tests give no reason for what they leave out."""
    return sum(
        1 for file in files for test in file.tests if test.status == "partly" and not test.kept
    )


def summary(files: tuple[UpstreamFile, ...]) -> str:
    """One line: how many upstream tests of how many files have each status, and how many
    partly covered ones are still open (no reason given for what they leave out)."""
    tally = counts(files)
    total = sum(tally.values())
    parts = ", ".join(f"{tally[status]} {status}" for status in STATUSES)
    still_open = open_partly(files)
    return (
        f"{total} test functions of {len(files)} upstream files: {parts}. "
        f"Of the partly covered, {tally['partly'] - still_open} leave out only what has a "
        f"stated reason and {still_open} are open."
    )


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _row(test: UpstreamTest) -> str:
    checks = "<br>".join(f"`{check}`" for check in test.checks) or "—"
    note = test.note + (f" **Kept:** {test.kept}" if test.kept else "")
    return f"| `{test.name}` | {test.status} | {checks} | {_cell(note)} |"


def page(files: tuple[UpstreamFile, ...]) -> str:
    """The Markdown page: the summary, then one table per upstream file."""
    lines = [
        "# Upstream's state-dict tests and the checks that judge them",
        "",
        "Made by `python -m conformance._upstream_map` from `conformance/upstream_map.toml`;",
        "edit that file, not this page. Each upstream test function is `covered` (the checks",
        "judge all it tests), `partly` (and what the checks leave out, with **Kept:** and the",
        "reason where it is left on purpose; one without is open), `out of scope` or",
        "`not covered` (and why). A check is `module::test function` under `conformance/`.",
        "",
        summary(files),
    ]
    for file in files:
        lines += [
            "",
            f"## `{file.path}`",
            "",
            f"Read at `{file.commit}`.",
            "",
            "| upstream test | status | checks | left out, or why |",
            "| --- | --- | --- | --- |",
            *(_row(test) for test in file.tests),
        ]
    return "\n".join(lines) + "\n"


def refreshed_readme(readme: str, files: tuple[UpstreamFile, ...]) -> str:
    """``readme`` with the counts between ``BEGIN`` and ``END`` made anew."""
    return with_section(readme, BEGIN, END, summary(files))


def main() -> int:
    files = load()
    if unknown := unknown_checks(files, existing_checks()):
        print("checks named in the map that do not exist:", *unknown, sep="\n  ")
        return 1
    PAGE.write_text(page(files))
    README.write_text(refreshed_readme(README.read_text(), files))
    print(f"wrote {PAGE} and the counts in {README}: {summary(files)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
