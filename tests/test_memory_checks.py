"""Which figures a memory check judges: host and device bytes each against their own part of
the bound, plus the 4 MiB slack and, on the host alone, the probe's resolution on this
machine; the host figure only where the backend keeps device tensors off the host."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from conformance.compare import Measured, _memory, assert_within_bounds
from harness.memory import Peak
from reference_impl.peak_memory import Footprint, PeakBound

MIB = 2**20
# A call that keeps 8 MiB on the device and nothing on the host.
BOUND = PeakBound("call", Footprint(device=8 * MIB), Footprint(), 8 * MIB, 8 * MIB)


@pytest.fixture(autouse=True)
def resolution_of_one_mib(monkeypatch: pytest.MonkeyPatch) -> None:
    """A probe good to 1 MiB on this machine: limits read bound + 4 MiB slack (+ 1 MiB on the
    host)."""
    monkeypatch.setattr(_memory, "host_resolution_bytes", lambda: MIB)


def world(backend: str, device_type: str = "cuda") -> SimpleNamespace:
    return SimpleNamespace(backend=backend, device_type=device_type, rank=1, size=2)


def test_an_accelerator_world_judges_host_and_device_each_against_its_part() -> None:
    assert_within_bounds(world("nccl"), "cell", [Measured(BOUND, Peak("cuda", 5 * MIB, 12 * MIB))])
    staged_on_host = Measured(BOUND, Peak("cuda", host=6 * MIB, device=8 * MIB))
    with pytest.raises(AssertionError, match=r"rank 1: call peaked over its bound \(host"):
        assert_within_bounds(world("nccl"), "cell", [staged_on_host])
    extra_on_device = Measured(BOUND, Peak("cuda", host=0, device=13 * MIB))
    with pytest.raises(AssertionError, match=r"\(cuda 13\.0 MiB > 12\.0 MiB\)"):
        assert_within_bounds(world("nccl"), "cell", [extra_on_device])


def test_gloo_stages_device_tensors_on_the_host_so_only_the_device_figure_is_judged() -> None:
    staged_on_host = Measured(BOUND, Peak("cuda", host=40 * MIB, device=8 * MIB))
    assert_within_bounds(world("gloo"), "cell", [staged_on_host])
    extra_on_device = Measured(BOUND, Peak("cuda", host=0, device=13 * MIB))
    with pytest.raises(AssertionError, match=r"cuda 13\.0 MiB > 12\.0 MiB"):
        assert_within_bounds(world("gloo"), "cell", [extra_on_device])


def test_a_cpu_world_holds_every_byte_to_the_whole_bound() -> None:
    # No device: the bound's device bytes are host bytes too, with the probe's resolution.
    on_host = Measured(BOUND, Peak("cpu", host=13 * MIB))
    assert_within_bounds(world("gloo", "cpu"), "cell", [on_host])
    with pytest.raises(AssertionError, match=r"host 14\.0 MiB > 13\.0 MiB") as failure:
        assert_within_bounds(world("gloo", "cpu"), "cell", [Measured(BOUND, Peak("cpu", 14 * MIB))])
    assert "slack 4.0 MiB + probe resolution 1.0 MiB" in str(failure.value)
