"""The conformance suite that judges the torch build under test.

What ``ci`` (the gate, the probe, the benchmarks) uses of the suite is exported here; the
suite's own tests import its private modules directly.
"""

from __future__ import annotations

from conformance import _golden as golden
from conformance._upstream import EXERCISED_APIS, dcp, dsd, lookup, sdu
from conformance.cells import PARALLELISMS, Parallelism
from conformance.compare import PEAK_LOG
from conformance.divergences.session import (
    UPSTREAM_MANIFEST,
    judges_staleness,
    resolution,
)
from conformance.models.common import MLPWithBuffers, batch

__all__ = [
    "EXERCISED_APIS",
    "PARALLELISMS",
    "PEAK_LOG",
    "UPSTREAM_MANIFEST",
    "MLPWithBuffers",
    "Parallelism",
    "batch",
    "dcp",
    "dsd",
    "golden",
    "judges_staleness",
    "lookup",
    "resolution",
    "sdu",
]
