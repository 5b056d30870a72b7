"""Which figures a memory check judges: host and device bytes each against their own part of
the bound, the host figure only where the backend keeps device tensors off the host."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from conformance._memory import Measured, allowance_bytes, assert_within_bounds
from harness.memory import Peak, mib
from reference_impl.peak_memory import Footprint, PeakBound

MIB = 2**20
# A call that keeps 8 MiB on the device and nothing on the host.
BOUND = PeakBound("call", Footprint(device=8 * MIB), Footprint(), 8 * MIB, 8 * MIB)
ALLOWANCE = allowance_bytes()
OVER = ALLOWANCE + MIB
# The figures a check prints for a peak of the bound plus OVER, and for its limit.
OVER_BOUND = re.escape(f"{mib(8 * MIB + OVER)} > {mib(8 * MIB + ALLOWANCE)}")


def world(backend: str, device_type: str = "cuda") -> SimpleNamespace:
    return SimpleNamespace(backend=backend, device_type=device_type, rank=1, size=2)


def test_an_accelerator_world_judges_host_and_device_each_against_its_part() -> None:
    staged_on_host = Measured(BOUND, Peak("cuda", host=OVER, device=8 * MIB))
    with pytest.raises(AssertionError, match=r"rank 1: call peaked over its bound \(host"):
        assert_within_bounds(world("nccl"), "cell", [staged_on_host])
    extra_on_device = Measured(BOUND, Peak("cuda", host=0, device=8 * MIB + OVER))
    with pytest.raises(AssertionError, match=rf"\(cuda {OVER_BOUND}\)"):
        assert_within_bounds(world("nccl"), "cell", [extra_on_device])


def test_gloo_stages_device_tensors_on_the_host_so_only_the_device_figure_is_judged() -> None:
    staged_on_host = Measured(BOUND, Peak("cuda", host=40 * MIB, device=8 * MIB))
    assert_within_bounds(world("gloo"), "cell", [staged_on_host])
    extra_on_device = Measured(BOUND, Peak("cuda", host=0, device=8 * MIB + OVER))
    with pytest.raises(AssertionError, match=rf"cuda {OVER_BOUND}"):
        assert_within_bounds(world("gloo"), "cell", [extra_on_device])


def test_a_cpu_world_holds_every_byte_to_the_whole_bound() -> None:
    # No device: the bound's device bytes are host bytes too.
    on_host = Measured(BOUND, Peak("cpu", host=8 * MIB + ALLOWANCE))
    assert_within_bounds(world("gloo", "cpu"), "cell", [on_host])
    with pytest.raises(AssertionError, match=rf"host {OVER_BOUND}"):
        assert_within_bounds(
            world("gloo", "cpu"), "cell", [Measured(BOUND, Peak("cpu", OVER + 8 * MIB))]
        )
