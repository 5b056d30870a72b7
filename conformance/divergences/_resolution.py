"""Manifests resolved for one torch build: what holds for its release, and how the release
stands against the releases the manifests were measured on."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from conformance.divergences._model import Known, Manifest, release_of


@dataclass(frozen=True)
class Resolution:
    """What the manifests say of one build: the holdings of their records that hold for its
    release, and whether any manifest recorded that release (if not, every ranged holding is
    inferred)."""

    release: Version
    known: list[Known]
    recorded: bool
    recorded_releases: tuple[Version, ...] = ()  # every manifest's, oldest first
    manifests: tuple[Path, ...] = ()  # the files resolved, in the order they apply

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
    def inferred(self) -> list[Known]:
        return [] if self.recorded else [known for known in self.known if known.releases]

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
            "known divergences inferred from their release ranges"
        )

    def unused(self, nodeids: Iterable[str], rootdir: Path) -> list[Known]:
        """The holdings no id of a run matches, among those the run can judge (a run of one
        module does not call the others' records stale)."""
        ids = list(nodeids)
        paths = {nodeid.split("::", 1)[0] for nodeid in ids}
        return [
            known
            for known in self.known
            if not any(known.matches(nodeid) for nodeid in ids)
            and known.is_judged_by(paths, rootdir)
        ]


def resolve(manifests: list[Manifest], torch_version: str) -> Resolution:
    """The holdings of ``manifests``' records that hold for the release of ``torch_version``."""
    release = release_of(torch_version)
    recorded = sorted({version for manifest in manifests for version in manifest.recorded})
    return Resolution(
        release=release,
        known=[k for m in manifests for d in m.divergences for k in d.known_in(release)],
        recorded=release in recorded,
        recorded_releases=tuple(recorded),
        manifests=tuple(manifest.path for manifest in manifests),
    )
