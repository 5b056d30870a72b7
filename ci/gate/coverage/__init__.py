"""What the gate's ids execute of torch's state-dict and checkpoint code.

``python -m ci.gate.coverage`` runs the whole gate with every rank tracing torch's measured
files (``harness/coverage.py``) and writes the release's coverage map,
``ci/gate/coverage-maps/torch-VERSION.json.xz``. ``python -m ci.gate --changed-against BASE``
runs the ids that execute what a build changed (``ci/gate/changed.py``).
"""

from __future__ import annotations

from pathlib import Path

MAPS = Path(__file__).resolve().parent.parent / "coverage-maps"
TIER_RELEASE = "2.13.0"  # the release the quick tier is chosen for: the default torch under test


def map_path(release: str) -> Path:
    """Where the coverage map of a torch release (``2.13.0``) is committed."""
    return MAPS / f"torch-{release}.json.xz"
