"""Known divergences of a torch version: test id patterns expected to fail, with reasons.

A manifest is a text file, one entry a line: ``pattern | reason | link``
(lines starting with ``#`` are comments). Patterns are ``fnmatch`` patterns over pytest node
ids. Each matching test is marked ``xfail(strict=True)``: it must still fail,
so a fixed build shows up as XPASS. Entries that match no collected test
are reported.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path

MANIFEST_DIR = Path(__file__).parent / "manifests"


@dataclass(frozen=True)
class Entry:
    pattern: str
    reason: str
    link: str
    source: str  # file:line, for messages

    def __post_init__(self) -> None:
        if not self.pattern or not self.reason or not self.link:
            raise ValueError(f"{self.source}: an entry needs a pattern, a reason and a link")

    def matches(self, nodeid: str) -> bool:
        return fnmatch.fnmatchcase(nodeid, self.pattern)


def parse(path: Path) -> list[Entry]:
    entries = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        parts = [part.strip() for part in text.split("|")]
        if len(parts) != 3:
            raise ValueError(f"{path}:{number}: expected 'pattern | reason | link', got {line!r}")
        entries.append(Entry(*parts, source=f"{path}:{number}"))
    return entries


def default_manifest(torch_version: str) -> Path | None:
    """``manifests/<version>.txt`` for a version like ``2.13.0+cpu`` (local part dropped)."""
    path = MANIFEST_DIR / f"{torch_version.split('+', 1)[0]}.txt"
    return path if path.exists() else None
