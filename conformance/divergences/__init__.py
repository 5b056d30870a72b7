"""Known divergences as data: manifests of records, each one thing upstream does wrong, and
where it holds (tests over a range of releases), resolved for the torch build under test.

Its modules use neither pytest nor torch (but ``session``, the pytest side): the suite's
conftest applies the records through ``conformance.divergences.session``, and ``ci``'s tools
(the gate, the release map, adopt) read the same files through this package. The file format
is in ``_toml.py``; ``conformance/README.md`` (known divergences) says how to add a record.

A test pattern is a pytest id in which ``*`` stands for any run of characters and ``?`` for
one; everything else, brackets included, is literal. ``skip`` says why the tests must not run
at all: ``hang``, ``crash`` (the world goes down with them) or ``flaky``. A build's release is
its version without pre-release, development and local parts (``2.15.0a0+gitabc``,
``2.15.0.dev20261101``, ``2.15.0+cu132`` and ``2.15.0+npu`` are all 2.15.0); on a release no
manifest records, the holdings that hold are inferred from their ranges.
"""

from __future__ import annotations

from conformance.divergences._model import (
    UNSAFE,
    Divergence,
    Holding,
    Known,
    Manifest,
    ManifestError,
    Unsafe,
    id_matches,
    release_of,
)
from conformance.divergences._ranges import Showing, fit_range
from conformance.divergences._resolution import Resolution, resolve
from conformance.divergences._toml import load, to_toml

__all__ = [
    "UNSAFE",
    "Divergence",
    "Holding",
    "Known",
    "Manifest",
    "ManifestError",
    "Resolution",
    "Showing",
    "Unsafe",
    "fit_range",
    "id_matches",
    "load",
    "release_of",
    "resolve",
    "to_toml",
]
