"""The peak-memory probe sees what a block held at most, over the baseline at its entry."""

from __future__ import annotations

import pytest
import torch

from harness import devices
from harness.memory import HOST_RESOLUTION_BYTES, host_probe_missing, measure_peak

MIB = 2**20
pytestmark = pytest.mark.skipif(host_probe_missing() is not None, reason=str(host_probe_missing()))


def _filled(size: int, device: str = "cpu") -> torch.Tensor:
    return torch.ones(size // 4, dtype=torch.float32, device=device)


def test_a_block_that_holds_nothing_peaks_below_the_resolution() -> None:
    with measure_peak() as peak:
        pass
    assert peak.host < HOST_RESOLUTION_BYTES
    assert peak.device is None


def test_a_tensor_freed_inside_the_block_still_counts() -> None:
    with measure_peak() as peak:
        first = _filled(64 * MIB)
        second = first.clone()
        del first, second
    assert 128 * MIB <= peak.host < 128 * MIB + 4 * MIB


def test_memory_held_before_the_block_is_baseline_not_peak() -> None:
    held = _filled(96 * MIB)
    with measure_peak() as peak:
        extra = _filled(16 * MIB)
    assert 16 * MIB <= peak.host < 16 * MIB + 4 * MIB
    del held, extra


def test_memory_freed_before_the_block_is_reused_without_hiding_the_peak() -> None:
    # Many small tensors leave the heap with free pages; the probe hands them back first,
    # so a block that allocates as much again shows it.
    small = [_filled(4096) for _ in range(8192)]
    del small
    with measure_peak() as peak:
        again = [_filled(4096) for _ in range(8192)]
    assert peak.host >= 32 * MIB
    del again


def test_peaks_describe_themselves_in_mib() -> None:
    with measure_peak() as peak:
        block = _filled(8 * MIB)
    assert peak.describe().startswith("host 8.")
    del block


@pytest.mark.skipif(devices.accelerator() is None, reason="no accelerator in this build or machine")
def test_an_accelerator_block_reports_its_device_peak() -> None:
    device_type = str(devices.accelerator())
    with measure_peak(device_type) as peak:
        on_device = _filled(64 * MIB, device_type)
        del on_device
    assert peak.device is not None
    assert 64 * MIB <= peak.device < 64 * MIB + 4 * MIB
