"""The range of releases a divergence holds for, fitted from how its tests showed in whole
gate runs of several releases (``python -m ci.releases``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from packaging.version import Version

# How a holding's tests showed in one release's run.
Showing = Literal["fails", "passes", "not run", "-"]


def _minor(release: Version) -> str:
    return f"{release.major}.{release.minor}"


def fit_range(showings: Mapping[Version, Showing]) -> str:
    """The range of releases a holding holds for, from how its tests showed in whole gate
    runs: from the oldest run where they fail up to, not including, the first later run where
    they pass. Runs where they did not run say nothing. One that fails, passes and fails again
    has no single range: ValueError, for a person to decide."""
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
