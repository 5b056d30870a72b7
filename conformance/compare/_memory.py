"""Peak-memory checks: one operation measured on a rank and held to the oracle's bound.

The probe is ``harness.memory``; the bounds are ``reference_impl.peak_memory``'s. Every bound
gets an allowance (``limit_of``): a slack measured on this suite's worlds (an operation
that holds no tensor of the state's size: allocator rounding, a collective's buffers, Python
objects per tensor), small against the state dicts the checks use
(``conformance.models.sized``), and the probe's resolution on this machine, which grows with
its CPUs. The slack was measured with 4 KiB pages: on another page size allocator rounding
differs, and the checks skip naming it, so that no machine turns the rounding into a verdict.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import pytest

from harness.memory import Peak, host_probe_missing, host_resolution_bytes, measure_peak, mib
from reference_impl.peak_memory import Footprint, PeakBound

# Measured on 2.13.0 and 2.8.0 at 2 and 4 gloo ranks: operations that allocate nothing of a
# tensor's size (_copy_state_dict, an offload to where the tensors already are) peak below
# 1 MiB; a gather of 160 tensors adds its Python objects and gloo's buffers.
SLACK_BYTES: Final = 4 * 2**20
SLACK_PAGE_BYTES: Final = 4096  # the page size the slack was measured with
# A file each rank appends one JSON line per measured call to (``python -m ci.peak_margins``).
PEAK_LOG: Final = "CONFORMANCE_PEAK_LOG"
# Backends that move an accelerator's tensors through host memory: gloo copies each CUDA
# tensor of a collective into host buffers. Measured on an H200 (gloo ranks sharing it): a
# FSDP1 unit's all-gather held the whole unit (39.5 MiB) on the host, beside the device
# copies the bounds expect. In their accelerator worlds the device figure is judged, and the
# host figure only logged.
STAGES_THROUGH_HOST: Final = frozenset({"gloo"})


@dataclass(frozen=True)
class Measured:
    """One operation's bound and the peak this rank measured for it."""

    bound: PeakBound
    peak: Peak

    def excess(self, separate_device: bool, judge_host: bool = True) -> str | None:
        """What went over the bound, in words, or None; the host figure only where
        ``judge_host``."""
        limit = limit_of(self.bound, separate_device)
        over = (
            [f"host {mib(self.peak.host)} > {mib(limit.host)}"]
            if judge_host and self.peak.host > limit.host
            else []
        )
        if separate_device and self.peak.device is not None and self.peak.device > limit.device:
            over.append(f"{self.peak.device_type} {mib(self.peak.device)} > {mib(limit.device)}")
        return ", ".join(over) or None

    def describe(self, rank: int, excess: str) -> str:
        bound = self.bound
        return (
            f"rank {rank}: {bound.operation} peaked over its bound ({excess}); bound = result "
            f"{mib(bound.result.total)} + transient {mib(bound.transient.total)} + slack "
            f"{mib(SLACK_BYTES)} + probe resolution {mib(host_resolution_bytes())}; largest "
            f"tensor {mib(bound.largest_tensor)}, whole state dict {mib(bound.whole_state_dict)}"
        )


def limit_of(bound: PeakBound, separate_device: bool) -> Footprint:
    """What a peak measured in this process may reach: the bound with the slack on each kind
    of memory, and on the host what the probe may misread here (the device's figures are
    the allocator's own, exact)."""
    limit = bound.limit(SLACK_BYTES, separate_device=separate_device)
    return Footprint(limit.host + host_resolution_bytes(), limit.device)


def skip_without_a_probe() -> None:
    """Skip (naming why) where this machine cannot measure a host peak, or rounds its pages
    otherwise than the slack was measured with."""
    missing = host_probe_missing()
    if missing is not None:
        pytest.skip(missing)
    page = os.sysconf("SC_PAGE_SIZE")
    if page != SLACK_PAGE_BYTES:
        pytest.skip(
            f"the slack of the bounds was measured with {SLACK_PAGE_BYTES} B pages; this kernel's "
            f"are {page} B, which round allocations otherwise"
        )


def measure(world: Any, bound: PeakBound, call: Callable[[], Any]) -> Measured:
    """``call()`` measured on this rank; what it returns is held until the peak is read."""
    with measure_peak(world.device_type) as peak:
        result = call()
    del result
    return Measured(bound, peak)


def assert_within_bounds(world: Any, where: str, measured: list[Measured]) -> None:
    """Fail naming every operation whose peak on this rank went over its bound; ``where``
    (the cell) labels the lines logged to ``$CONFORMANCE_PEAK_LOG``."""
    separate = world.device_type != "cpu"
    judge_host = not separate or world.backend not in STAGES_THROUGH_HOST
    _log(world, where, measured, separate)
    failures = [
        item.describe(world.rank, excess)
        for item in measured
        if (excess := item.excess(separate, judge_host)) is not None
    ]
    assert not failures, "\n".join(failures)


def _log(world: Any, where: str, measured: list[Measured], separate_device: bool) -> None:
    path = os.environ.get(PEAK_LOG)
    if not path:
        return
    lines = []
    for item in measured:
        limit = limit_of(item.bound, separate_device)
        record = {"where": where, "size": world.size, "rank": world.rank}
        record |= {"operation": item.bound.operation, "peak": item.peak.host}
        record |= {"limit": limit.host, "device_peak": item.peak.device}
        record |= {"device_limit": limit.device if separate_device else None}
        lines.append(json.dumps(record) + "\n")
    with open(path, "a") as log:
        log.write("".join(lines))
