"""The records of known divergences: one record per divergence, holding for tests and releases.

A divergence is one thing upstream does wrong, stated once (its reason and link). It holds
for one or more sets of tests, each over a range of releases and each either expected to fail
or, where it hangs, crashes or flakes, not run at all: a :class:`Holding`. What marks the
tests of one release is a :class:`Known`: a divergence and one of its holdings.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

Unsafe = Literal["hang", "crash", "flaky"]
UNSAFE: tuple[str, ...] = get_args(Unsafe)
_URL = re.compile(r"https?://\S+\Z")
_ID = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*\Z")


class ManifestError(ValueError):
    """A manifest that cannot be applied; the message names the file and the record."""


def release_of(version: str) -> Version:
    """The release a torch build belongs to: ``2.15.0a0+gitabc`` -> 2.15.0."""
    try:
        return Version(Version(version).base_version)
    except InvalidVersion:
        raise ValueError(f"torch version {version!r} is not a PEP 440 version") from None


@functools.lru_cache(maxsize=4096)
def _compiled(pattern: str) -> re.Pattern[str]:
    wildcards = {"*": ".*", "?": "."}
    return re.compile("".join(wildcards.get(char) or re.escape(char) for char in pattern))


def id_matches(pattern: str, nodeid: str) -> bool:
    """Whether ``nodeid`` is one of the ids ``pattern`` names (``*``, ``?`` the wildcards)."""
    return _compiled(pattern).fullmatch(nodeid) is not None


@dataclass(frozen=True)
class Holding:
    """Tests a divergence holds for, over ``releases`` (a PEP 440 specifier; "": every
    release): they must fail, or, with ``skip``, must not run."""

    tests: tuple[str, ...]
    releases: str = ""
    skip: Unsafe | None = None

    def check(self, where: str) -> None:
        """Refuse, naming ``where``, a holding that cannot be applied."""
        if not self.tests or not all(isinstance(test, str) and test for test in self.tests):
            raise ManifestError(f"{where}: tests must list at least one test id or pattern")
        if self.skip is not None and self.skip not in UNSAFE:
            raise ManifestError(f"{where}: skip must be one of {UNSAFE}, got {self.skip!r}")
        try:
            SpecifierSet(self.releases)
        except InvalidSpecifier:
            raise ManifestError(
                f"{where}: releases must be a PEP 440 specifier such as >=2.6,<2.15, "
                f"got {self.releases!r}"
            ) from None

    def holds_for(self, release: Version) -> bool:
        return SpecifierSet(self.releases).contains(release, prereleases=True)

    def matches(self, nodeid: str) -> bool:
        return any(id_matches(test, nodeid) for test in self.tests)


@dataclass(frozen=True)
class Divergence:
    """One known divergence: what goes wrong (stated once), where it is known, and where it
    holds."""

    id: str
    link: str
    reason: str
    holdings: tuple[Holding, ...]
    source: str = ""  # "file#id", for messages
    root: Path | None = None  # where the tests' paths lie; None: the run's rootdir

    def __post_init__(self) -> None:
        where = self.source or self.id
        if not _ID.match(self.id):
            raise ManifestError(f"{where}: id must be lowercase words joined by '-': {self.id!r}")
        if not _URL.match(self.link):
            raise ManifestError(
                f"{where}: link must be a URL (the issue, commit or source line where the "
                f"divergence is known), got {self.link!r}"
            )
        if not self.reason.strip():
            raise ManifestError(f"{where}: a divergence needs a reason")
        if not self.holdings:
            raise ManifestError(f"{where}: a divergence holds for at least one set of tests")
        for holding in self.holdings:
            holding.check(where)

    def known_in(self, release: Version) -> list[Known]:
        """How this divergence marks tests of ``release``: one entry per holding whose range
        contains it."""
        return [Known(self, holding) for holding in self.holdings if holding.holds_for(release)]


@dataclass(frozen=True)
class Known:
    """A divergence as it marks some tests of one release: one of its holdings."""

    divergence: Divergence
    holding: Holding

    @property
    def id(self) -> str:
        return self.divergence.id

    @property
    def link(self) -> str:
        return self.divergence.link

    @property
    def reason(self) -> str:
        return self.divergence.reason

    @property
    def source(self) -> str:
        return self.divergence.source

    @property
    def releases(self) -> str:
        return self.holding.releases

    @property
    def skip(self) -> Unsafe | None:
        return self.holding.skip

    @property
    def tests(self) -> tuple[str, ...]:
        return self.holding.tests

    @property
    def kind(self) -> Literal["xfail", "skip"]:
        return "xfail" if self.skip is None else "skip"

    def matches(self, nodeid: str) -> bool:
        return self.holding.matches(nodeid)

    def is_judged_by(self, collected_paths: set[str], rootdir: Path) -> bool:
        """Whether a run that collected ``collected_paths`` can tell this holding is stale: it
        collected a module a test names, or such a module no longer exists."""
        modules = {test.split("::", 1)[0] for test in self.tests}
        if any(id_matches(module, path) for module in modules for path in collected_paths):
            return True
        root = self.divergence.root or rootdir
        return not any(any(root.glob(module)) for module in modules)


@dataclass(frozen=True)
class Manifest:
    """One manifest file: its records and the releases their ranges were measured on."""

    path: Path
    divergences: list[Divergence]
    recorded: list[Version]
