"""Known divergences of a torch version: test id patterns expected to fail, with reasons.

A manifest is a text file, one entry a line: ``pattern | reason | link``, or
``skip | pattern | reason | link`` for a test that must not run at all (it would hang or
take the world down with it); lines starting with ``#`` are comments. Patterns are
``fnmatch`` patterns over pytest node ids. Each test an xfail entry matches is marked
``xfail(strict=True)``: it must still fail, so a fixed build shows up as XPASS. Entries
that match no test of a collected module, or name a module that no longer exists, are
reported.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path

import pytest

MANIFEST_DIR = Path(__file__).parent / "manifests"
KINDS = ("xfail", "skip")


@dataclass(frozen=True)
class Entry:
    pattern: str
    reason: str
    link: str
    source: str  # file:line, for messages
    kind: str = "xfail"

    def __post_init__(self) -> None:
        if not self.pattern or not self.reason or not self.link:
            raise ValueError(f"{self.source}: an entry needs a pattern, a reason and a link")
        if self.kind not in KINDS:
            raise ValueError(f"{self.source}: kind must be one of {KINDS}, got {self.kind!r}")

    def matches(self, nodeid: str) -> bool:
        return fnmatch.fnmatchcase(nodeid, self.pattern)

    def is_judged_by(self, collected_paths: set[str], rootdir: Path) -> bool:
        """Whether a run that collected ``collected_paths`` can tell this entry is stale:
        it collected the module the pattern names, or no such module exists any more."""
        module_pattern = self.pattern.split("::", 1)[0]
        if any(fnmatch.fnmatchcase(path, module_pattern) for path in collected_paths):
            return True
        return not any(rootdir.glob(module_pattern))

    def marker(self) -> pytest.MarkDecorator:
        """The mark this entry puts on the tests it matches."""
        reason = f"{self.reason} ({self.link})"
        if self.kind == "skip":
            return pytest.mark.skip(reason=f"manifest: {reason}")
        return pytest.mark.xfail(reason=reason, strict=True)


# For reports: the manifests applied, and their entries that matched no collected test of
# a module the run collected (a run of one module does not call the others' entries stale).
APPLIED_MANIFESTS = pytest.StashKey[list[Path]]()
UNUSED_ENTRIES = pytest.StashKey[list[Entry]]()


def parse(path: Path) -> list[Entry]:
    entries = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        parts = [part.strip() for part in text.split("|")]
        kind = parts.pop(0) if len(parts) == 4 else "xfail"
        if len(parts) != 3:
            raise ValueError(
                f"{path}:{number}: expected '[skip |] pattern | reason | link', got {line!r}"
            )
        pattern, reason, link = parts
        entries.append(Entry(pattern, reason, link, source=f"{path}:{number}", kind=kind))
    return entries


def default_manifest(torch_version: str) -> Path | None:
    """``manifests/<version>.txt`` for a version like ``2.13.0+cpu`` (local part dropped)."""
    path = MANIFEST_DIR / f"{torch_version.split('+', 1)[0]}.txt"
    return path if path.exists() else None
