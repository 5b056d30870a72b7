"""Known divergences as data: the records of a manifest, resolved for a torch release.

A manifest is a TOML file (read with ``tomllib``; ``tomli`` on Python 3.10)::

    recorded = ["2.13.0", "2.15.0"]      # releases whose whole gate runs fitted the ranges

    [[divergence]]
    id = "cpu-state-dict-of-a-viewed-dtensor"
    releases = ">=2.11"                  # PEP 440, over the build's release; absent: every one
    link = "https://github.com/pytorch/pytorch/issues/123"
    reason = "what upstream does wrong, stated once"
    skip = "hang"                        # absent: an expected failure (strict xfail)
    tests = ["conformance/test_x.py::test_y[w2-*]"]

One record is one divergence, however many tests it covers. A test pattern is a pytest id in
which ``*`` stands for any run of characters and ``?`` for one; everything else, brackets
included, is literal. ``skip`` says why the tests must not run at all: ``hang``, ``crash``
(the world goes down with them) or ``flaky`` (they pass or fail at random).

A build's release is its version without pre-release, development and local parts
(``2.15.0a0+gitabc``, ``2.15.0.dev20261101``, ``2.15.0+cu132`` and a vendor's ``2.15.0+npu``
are all 2.15.0); on a release no manifest records, the records that hold are inferred from
their ranges. This module imports neither pytest nor torch: the suite's conftest applies
it, and ``ci``'s tools (the gate, the release map, adopt) read the same files through it.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

Unsafe = Literal["hang", "crash", "flaky"]
UNSAFE: tuple[str, ...] = get_args(Unsafe)
# How a record's tests showed in one release's run, for fitting its range.
Showing = Literal["fails", "passes", "not run", "-"]
_URL = re.compile(r"https?://\S+\Z")
_ID = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*\Z")
_FIELDS = {"id", "releases", "link", "reason", "skip", "tests"}


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
class Divergence:
    """One known divergence: why, where it is known, for which releases, which tests."""

    id: str
    link: str
    reason: str
    tests: tuple[str, ...]
    releases: str = ""  # a PEP 440 specifier; "" holds for every release
    skip: Unsafe | None = None  # None: the tests run and must fail
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

    @property
    def kind(self) -> Literal["xfail", "skip"]:
        return "xfail" if self.skip is None else "skip"

    def holds_for(self, release: Version) -> bool:
        """Whether this divergence is known in ``release`` (its range contains it)."""
        return SpecifierSet(self.releases).contains(release, prereleases=True)

    def matches(self, nodeid: str) -> bool:
        return any(id_matches(test, nodeid) for test in self.tests)

    def is_judged_by(self, collected_paths: set[str], rootdir: Path) -> bool:
        """Whether a run that collected ``collected_paths`` can tell this record is stale: it
        collected a module a test names, or such a module no longer exists."""
        modules = {test.split("::", 1)[0] for test in self.tests}
        if any(id_matches(module, path) for module in modules for path in collected_paths):
            return True
        return not any(any((self.root or rootdir).glob(module)) for module in modules)


@dataclass(frozen=True)
class Manifest:
    """One manifest file: its records and the releases their ranges were measured on."""

    path: Path
    divergences: list[Divergence]
    recorded: list[Version] = field(default_factory=list)


def _divergence(record: object, number: int, path: Path, root: Path | None) -> Divergence:
    where = f"{path}: divergence {number}"
    if not isinstance(record, dict):
        raise ManifestError(f"{where}: expected a table")
    if "id" in record:
        where = f"{path}#{record['id']}"
    unknown = sorted(set(record) - _FIELDS)
    missing = sorted({"id", "link", "reason", "tests"} - set(record))
    if unknown or missing:
        raise ManifestError(f"{where}: unknown fields {unknown}, missing fields {missing}")
    tests = record["tests"]
    if not isinstance(tests, list):
        raise ManifestError(f"{where}: tests must be a list of test ids or patterns")
    return Divergence(
        id=str(record["id"]),
        link=str(record["link"]),
        reason=" ".join(str(record["reason"]).split()),
        tests=tuple(tests),
        releases=str(record.get("releases", "")),
        skip=record.get("skip"),
        source=where,
        root=root,
    )


def load(path: Path, root: Path | None = None) -> Manifest:
    """The manifest at ``path``; ``root`` is where its tests' paths lie (default: the rootdir
    of the run that applies it)."""
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise ManifestError(
            f"{path}: not a TOML manifest ({error}); a manifest in the earlier line format "
            "converts with python -m ci.gate.convert_manifest"
        ) from None
    unknown = sorted(set(data) - {"recorded", "divergence"})
    if unknown:
        raise ManifestError(f"{path}: unknown top-level keys {unknown}")
    try:
        recorded = sorted(Version(str(release)) for release in data.get("recorded", []))
    except InvalidVersion as error:
        raise ManifestError(f"{path}: recorded takes release numbers ({error})") from None
    divergences = [
        _divergence(record, number, path, root)
        for number, record in enumerate(data.get("divergence", []), start=1)
    ]
    ids = [divergence.id for divergence in divergences]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise ManifestError(f"{path}: ids given to more than one divergence: {twice}")
    return Manifest(path, divergences, recorded)


@dataclass(frozen=True)
class Resolution:
    """What the manifests say of one build: the records that hold for its release, and
    whether any manifest recorded that release (if not, every ranged record is inferred)."""

    release: Version
    divergences: list[Divergence]
    recorded: bool
    recorded_releases: tuple[Version, ...] = ()  # every manifest's, oldest first

    @property
    def newest_recorded(self) -> Version | None:
        return self.recorded_releases[-1] if self.recorded_releases else None

    @property
    def oldest_recorded(self) -> Version | None:
        return self.recorded_releases[0] if self.recorded_releases else None

    @property
    def lies_between(self) -> tuple[Version, Version] | None:
        """The recorded releases just before and just after an unrecorded one, where both
        exist: the releases whose runs its inferred ranges rest on."""
        older = [r for r in self.recorded_releases if r < self.release]
        newer = [r for r in self.recorded_releases if r > self.release]
        return (older[-1], newer[0]) if older and newer and not self.recorded else None

    @property
    def inferred(self) -> list[Divergence]:
        return [] if self.recorded else [d for d in self.divergences if d.releases]

    @property
    def predates_the_suite(self) -> bool:
        """Whether the release is older than every recorded one: the suite was not measured
        there, so its failures may be the suite's own (conformance/README.md, releases)."""
        return self.oldest_recorded is not None and self.release < self.oldest_recorded

    def describe(self) -> str:
        """One line on how the build's release resolved against the recorded releases."""
        if self.recorded:
            return f"torch release {self.release} (recorded)"
        if self.predates_the_suite:
            return (
                f"torch release {self.release} predates the oldest recorded release "
                f"({self.oldest_recorded}), the oldest this suite serves: failures may be the "
                "suite's own"
            )
        if self.lies_between is not None:
            where = "it lies between recorded {} and {}".format(*self.lies_between)
        else:
            where = f"newer than every recorded release (newest: {self.newest_recorded})"
        return (
            f"torch release {self.release} is not recorded: {where}; {len(self.inferred)} "
            "divergences inferred from their release ranges"
        )

    def unused(self, nodeids: Iterable[str], rootdir: Path) -> list[Divergence]:
        """The records no id of a run matches, among those the run can judge (a run of one
        module does not call the others' records stale)."""
        ids = list(nodeids)
        paths = {nodeid.split("::", 1)[0] for nodeid in ids}
        return [
            divergence
            for divergence in self.divergences
            if not any(divergence.matches(nodeid) for nodeid in ids)
            and divergence.is_judged_by(paths, rootdir)
        ]


def resolve(manifests: list[Manifest], torch_version: str) -> Resolution:
    """The records of ``manifests`` that hold for the release of ``torch_version``."""
    release = release_of(torch_version)
    recorded = sorted({version for manifest in manifests for version in manifest.recorded})
    return Resolution(
        release=release,
        divergences=[d for m in manifests for d in m.divergences if d.holds_for(release)],
        recorded=release in recorded,
        recorded_releases=tuple(recorded),
    )


def _minor(release: Version) -> str:
    return f"{release.major}.{release.minor}"


def fit_range(showings: Mapping[Version, Showing]) -> str:
    """The range of releases a divergence holds for, from how its tests showed in whole
    gate runs: from the oldest run where they fail up to, not including, the first later run
    where they pass. Runs where they did not run say nothing. A divergence that fails,
    passes and fails again has no single range: ValueError, for a person to decide."""
    judged = [(release, showings[release]) for release in sorted(showings)]
    judged = [(release, showing) for release, showing in judged if showing in ("fails", "passes")]
    failing = [release for release, showing in judged if showing == "fails"]
    if not failing:
        raise ValueError("its tests failed in no run: the divergence holds for no release")
    first = failing[0]
    fixed = [release for release, showing in judged if showing == "passes" and release > first]
    if fixed and any(release > fixed[0] for release in failing):
        raise ValueError(
            f"its tests fail in {', '.join(map(str, failing))} but pass in {fixed[0]}: no "
            "single range"
        )
    start = f">={_minor(first)}" if first.micro == 0 else f">={first}"
    return f"{start},<{fixed[0]}" if fixed else start


def _string(text: str) -> str:
    """``text`` as a TOML basic string."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in escaped) + '"'


def _wrapped(text: str, width: int = 92) -> str:
    """``text`` as a TOML multi-line string, one line per ``width`` characters, whose line
    ends join with one space (a line-ending backslash trims the newline and indent)."""
    words, lines, line = _string(text)[1:-1].split(" "), [], ""
    for word in words:
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    lines.append(line)
    if len(lines) == 1:
        return f'"{lines[0]}"'
    body = " \\\n    ".join(lines)
    return f'"""\\\n    {body}"""'


def to_toml(
    divergences: Iterable[Divergence], recorded: Iterable[Version] = (), header: str = ""
) -> str:
    """The manifest text of ``divergences``: one ``[[divergence]]`` table each, in order."""
    out = [f"# {line}".rstrip() for line in header.splitlines()]
    releases = list(recorded)
    if releases:
        out += ["", f"recorded = [{', '.join(_string(str(r)) for r in releases)}]"]
    for divergence in divergences:
        out += ["", "[[divergence]]", f"id = {_string(divergence.id)}"]
        if divergence.releases:
            out.append(f"releases = {_string(divergence.releases)}")
        if divergence.skip:
            out.append(f"skip = {_string(divergence.skip)}")
        out.append(f"link = {_string(divergence.link)}")
        out.append(f"reason = {_wrapped(divergence.reason)}")
        out.append("tests = [")
        out += [f"    {_string(test)}," for test in divergence.tests]
        out.append("]")
    return "\n".join(out).lstrip("\n") + "\n"
