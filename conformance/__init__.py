"""The conformance suite that judges the torch build under test.

What ``ci`` (the gate, the probe, the benchmarks) uses of the suite is exported here; the
suite's own tests import its private modules directly.
"""

from __future__ import annotations

from conformance._manifest import (
    APPLIED_MANIFESTS,
    RESOLUTION,
    UNUSED_ENTRIES,
    UPSTREAM_MANIFEST,
    Entry,
    parse,
    release_of,
)
from conformance._memory import PEAK_LOG
from conformance._parallelisms import PARALLELISMS, Parallelism
from conformance._upstream import EXERCISED_APIS, dcp, dsd, lookup, sdu
from conformance.models.common import MLPWithBuffers, batch

__all__ = [
    "APPLIED_MANIFESTS",
    "EXERCISED_APIS",
    "PARALLELISMS",
    "PEAK_LOG",
    "RESOLUTION",
    "UNUSED_ENTRIES",
    "UPSTREAM_MANIFEST",
    "Entry",
    "MLPWithBuffers",
    "Parallelism",
    "batch",
    "dcp",
    "dsd",
    "lookup",
    "parse",
    "release_of",
    "sdu",
]
