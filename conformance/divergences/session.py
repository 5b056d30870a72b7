"""The suite's known divergences in a pytest session: which manifests apply, their resolution
for the torch under test (made once, read by the conftest and the gate's recorder alike), and
what each holding does to the tests it covers. The records themselves are data
(``conformance.divergences``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from conformance._golden import SETS_VARIABLE
from conformance.divergences._model import Known, Manifest
from conformance.divergences._resolution import Resolution, resolve
from conformance.divergences._toml import load

MANIFEST_DIR = Path(__file__).parents[1] / "manifests"
# Upstream's known divergences, every release's: applied to every run, by release. Its tests
# name this suite's modules, relative to the project's root.
UPSTREAM_MANIFEST = MANIFEST_DIR / "upstream.toml"
SUITE_ROOT = MANIFEST_DIR.parents[1]
_RESOLUTION = pytest.StashKey[Resolution]()
# A lifted skip runs in a world of its own; this long at most, since it may hang.
LIFTED_SKIP_DEADLINE_S = 60.0


def applied_manifests(fork_manifests: list[str]) -> list[Manifest]:
    """Upstream's manifest and a fork's own, in the order they apply."""
    return [load(UPSTREAM_MANIFEST, root=SUITE_ROOT), *(load(Path(p)) for p in fork_manifests)]


def resolution(config: pytest.Config) -> Resolution:
    """Upstream's manifest and a fork's (``--manifest``), resolved for the torch under test:
    made once a session, by whichever asks first (the conftest, at collection)."""
    if _RESOLUTION not in config.stash:
        manifests = applied_manifests(config.getoption("manifest") or [])
        config.stash[_RESOLUTION] = resolve(manifests, torch.__version__)
    return config.stash[_RESOLUTION]


def marker(known: Known) -> pytest.MarkDecorator:
    """The mark a holding puts on the tests it covers: an expected failure, or a skip."""
    reason = f"{known.reason} ({known.link})"
    if known.skip is not None:
        return pytest.mark.skip(reason=f"manifest: {reason}")
    return pytest.mark.xfail(reason=reason, strict=True)


def lifted_markers(known: Known) -> list[pytest.MarkDecorator]:
    """What a skip holding does to its tests when skips are lifted: they run, each in a world
    of its own under a short deadline, and must still fail; one that passes shows as XPASS."""
    reason = f"skipped ({known.skip}) by {known.id}: {known.reason}"
    return [
        pytest.mark.xfail(reason=f"{reason} ({known.link})", strict=True),
        pytest.mark.world_alone(timeout=LIFTED_SKIP_DEADLINE_S),
    ]


def judges_staleness(config: pytest.Config) -> bool:
    """Whether a run can call records stale: not one of chosen ids (``path::name``, ``-k``,
    ``-m``), which leaves out tests that records rightly name, nor one that loads golden sets
    other than the committed ones (``GATE_GOLDEN_SETS``), whose ids name other releases."""
    chosen = any("::" in arg for arg in config.args)
    other_sets = bool(os.environ.get(SETS_VARIABLE))
    return not (chosen or other_sets or config.option.keyword or config.option.markexpr)
