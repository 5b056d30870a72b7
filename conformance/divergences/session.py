"""The suite's known divergences in pytest: which manifests apply, and what each record does
to the tests it covers. The records themselves are data (``harness.manifest``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conformance._golden import SETS_VARIABLE
from harness.manifest import Divergence, Manifest, load

MANIFEST_DIR = Path(__file__).parent / "manifests"
# Upstream's known divergences, every release's: applied to every run, by release. Its tests
# name this suite's modules, relative to the project's root.
UPSTREAM_MANIFEST = MANIFEST_DIR / "upstream.toml"
SUITE_ROOT = MANIFEST_DIR.parents[1]
# A lifted skip runs in a world of its own; this long at most, since it may hang.
LIFTED_SKIP_DEADLINE_S = 60.0


def applied_manifests(fork_manifests: list[str]) -> list[Manifest]:
    """Upstream's manifest and a fork's own, in the order they apply."""
    return [load(UPSTREAM_MANIFEST, root=SUITE_ROOT), *(load(Path(p)) for p in fork_manifests)]


def marker(divergence: Divergence) -> pytest.MarkDecorator:
    """The mark a record puts on the tests it covers: an expected failure, or a skip."""
    reason = f"{divergence.reason} ({divergence.link})"
    if divergence.skip is not None:
        return pytest.mark.skip(reason=f"manifest: {reason}")
    return pytest.mark.xfail(reason=reason, strict=True)


def lifted_markers(divergence: Divergence) -> list[pytest.MarkDecorator]:
    """What a skip record does to its tests when skips are lifted: they run, each in a world
    of its own under a short deadline, and must still fail; one that passes shows as XPASS."""
    reason = f"skipped ({divergence.skip}) by {divergence.id}: {divergence.reason}"
    return [
        pytest.mark.xfail(reason=f"{reason} ({divergence.link})", strict=True),
        pytest.mark.world_alone(timeout=LIFTED_SKIP_DEADLINE_S),
    ]


def judges_staleness(config: pytest.Config) -> bool:
    """Whether a run can call records stale: not one of chosen ids (``path::name``, ``-k``,
    ``-m``), which leaves out tests that records rightly name, nor one that loads golden sets
    other than the committed ones (``GATE_GOLDEN_SETS``), whose ids name other releases."""
    chosen = any("::" in arg for arg in config.args)
    other_sets = bool(os.environ.get(SETS_VARIABLE))
    return not (chosen or other_sets or config.option.keyword or config.option.markexpr)
