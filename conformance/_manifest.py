"""Known divergences: test id patterns expected to fail, with reasons, by torch release.

A manifest is a text file, one entry a line: ``[releases SPEC |] [skip |] pattern | reason |
link``; lines starting with ``#`` are comments. ``SPEC`` is a PEP 440 specifier over the
release of the build under test (``releases >=2.6,<2.15``); an entry without one holds for
every release, as a fork's own entries do. ``skip`` marks a test that must not run at all (it
would hang or take the world down with it). Patterns are ``fnmatch`` patterns over pytest
node ids. Each test an xfail entry matches is marked ``xfail(strict=True)``: it must still
fail, so a fixed build shows up as XPASS. Entries that match no test of a collected module,
or name a module that no longer exists, are reported.

A line ``recorded 2.13.0 2.15.0`` names the releases the entries' ranges were measured on.
A build's release is its version without pre-release, development and local parts
(``2.15.0a0+gitabc``, ``2.15.0.dev20261101``, ``2.15.0+cu132`` and a vendor's ``2.15.0+npu``
are all 2.15.0); on a release no manifest records, the entries that hold are inferred from
their ranges, and the gate says so.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

MANIFEST_DIR = Path(__file__).parent / "manifests"
# Upstream's known divergences, every release's: applied to every run, by release. Its
# patterns name this suite's modules, relative to the project's root.
UPSTREAM_MANIFEST = MANIFEST_DIR / "upstream.txt"
SUITE_ROOT = MANIFEST_DIR.parents[1]
KINDS = ("xfail", "skip")
RELEASES, RECORDED = "releases ", "recorded "


def release_of(version: str) -> Version:
    """The release a torch build belongs to: ``2.15.0a0+gitabc`` -> 2.15.0."""
    try:
        return Version(Version(version).base_version)
    except InvalidVersion:
        raise ValueError(f"torch version {version!r} is not a PEP 440 version") from None


@dataclass(frozen=True)
class Entry:
    pattern: str
    reason: str
    link: str
    source: str  # file:line, for messages
    kind: str = "xfail"
    releases: str = ""  # a PEP 440 specifier; "" holds for every release
    root: Path | None = None  # where the patterns' paths lie; None: the run's rootdir

    def __post_init__(self) -> None:
        if not self.pattern or not self.reason or not self.link:
            raise ValueError(f"{self.source}: an entry needs a pattern, a reason and a link")
        if self.kind not in KINDS:
            raise ValueError(f"{self.source}: kind must be one of {KINDS}, got {self.kind!r}")
        try:
            SpecifierSet(self.releases)
        except InvalidSpecifier:
            raise ValueError(
                f"{self.source}: releases must be a PEP 440 specifier such as >=2.6,<2.15, "
                f"got {self.releases!r}"
            ) from None

    def holds_for(self, release: Version) -> bool:
        """Whether this divergence is known in ``release`` (its range contains it)."""
        return SpecifierSet(self.releases).contains(release, prereleases=True)

    def matches(self, nodeid: str) -> bool:
        return fnmatch.fnmatchcase(nodeid, self.pattern)

    def is_judged_by(self, collected_paths: set[str], rootdir: Path) -> bool:
        """Whether a run that collected ``collected_paths`` can tell this entry is stale:
        it collected the module the pattern names, or no such module exists any more."""
        module_pattern = self.pattern.split("::", 1)[0]
        if any(fnmatch.fnmatchcase(path, module_pattern) for path in collected_paths):
            return True
        return not any((self.root or rootdir).glob(module_pattern))

    def marker(self) -> pytest.MarkDecorator:
        """The mark this entry puts on the tests it matches."""
        reason = f"{self.reason} ({self.link})"
        if self.kind == "skip":
            return pytest.mark.skip(reason=f"manifest: {reason}")
        return pytest.mark.xfail(reason=reason, strict=True)


@dataclass(frozen=True)
class Manifest:
    """One manifest file: its entries and the releases their ranges were measured on."""

    entries: list[Entry]
    recorded: list[Version] = field(default_factory=list)


def _entry(line: str, source: str, root: Path | None) -> Entry:
    parts = [part.strip() for part in line.split("|")]
    releases = parts.pop(0).removeprefix(RELEASES).strip() if parts[0].startswith(RELEASES) else ""
    kind = parts.pop(0) if len(parts) == 4 else "xfail"
    if len(parts) != 3:
        raise ValueError(
            f"{source}: expected '[releases SPEC |] [skip |] pattern | reason | link', got {line!r}"
        )
    pattern, reason, link = parts
    return Entry(pattern, reason, link, source, kind, releases, root)


def _recorded(line: str, source: str) -> list[Version]:
    try:
        return [Version(word) for word in line.removeprefix(RECORDED).split()]
    except InvalidVersion:
        raise ValueError(f"{source}: 'recorded' takes release numbers, got {line!r}") from None


def parse(path: Path, root: Path | None = None) -> Manifest:
    """The manifest at ``path``; ``root`` is where its patterns' paths lie (default: the
    rootdir of the run that applies it)."""
    entries: list[Entry] = []
    recorded: list[Version] = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        text, source = line.strip(), f"{path}:{number}"
        if not text or text.startswith("#"):
            continue
        if text.startswith(RECORDED):
            recorded += _recorded(text, source)
        else:
            entries.append(_entry(text, source, root))
    return Manifest(entries, sorted(recorded))


@dataclass(frozen=True)
class Resolution:
    """What the manifests say of one build: the entries that hold for its release, and
    whether any manifest recorded that release (if not, every upstream entry is inferred
    from its range)."""

    release: Version
    entries: list[Entry]
    recorded: bool
    newest_recorded: Version | None
    oldest_recorded: Version | None = None

    @property
    def inferred(self) -> list[Entry]:
        return [] if self.recorded else [entry for entry in self.entries if entry.releases]

    @property
    def predates_the_suite(self) -> bool:
        """Whether the release is older than every recorded one: the suite was not measured
        there, so its failures may be the suite's own (conformance/README.md, releases)."""
        return self.oldest_recorded is not None and self.release < self.oldest_recorded


def resolve(manifests: list[Manifest], torch_version: str) -> Resolution:
    """The entries of ``manifests`` that hold for the release of ``torch_version``."""
    release = release_of(torch_version)
    recorded = sorted({version for manifest in manifests for version in manifest.recorded})
    return Resolution(
        release=release,
        entries=[e for m in manifests for e in m.entries if e.holds_for(release)],
        recorded=release in recorded,
        newest_recorded=recorded[-1] if recorded else None,
        oldest_recorded=recorded[0] if recorded else None,
    )


# For reports: the manifests applied, their entries that matched no collected test of a
# module the run collected (a run of one module does not call the others' entries stale),
# and how the build's release resolved.
APPLIED_MANIFESTS = pytest.StashKey[list[Path]]()
UNUSED_ENTRIES = pytest.StashKey[list[Entry]]()
RESOLUTION = pytest.StashKey[Resolution]()
