"""The peak-memory probe sees what a block held at most, over the baseline at its entry,
to within its stated resolution (it may read low by up to ``host_resolution_bytes()``)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness import devices
from harness.memory import (
    ALLOCATOR_ENV,
    Peak,
    host_probe_missing,
    host_resolution_bytes,
    measure_peak,
)

MIB = 2**20
RESOLUTION = host_resolution_bytes()
pytestmark = pytest.mark.skipif(host_probe_missing() is not None, reason=str(host_probe_missing()))


@pytest.fixture(autouse=True, scope="module")
def _intra_op_threads_started() -> None:
    """The intra-op thread pool starts at a process's first parallel operation, with its
    threads' stacks and heaps; start it before the blocks these tests measure."""
    torch.ones(2**22).add_(1)


def _filled(size: int, device: str = "cpu") -> torch.Tensor:
    return torch.ones(size // 4, dtype=torch.float32, device=device)


def test_a_block_that_holds_nothing_peaks_below_the_resolution() -> None:
    with measure_peak() as peak:
        pass
    assert peak.host < RESOLUTION
    assert peak.device is None


def test_a_tensor_freed_inside_the_block_still_counts() -> None:
    with measure_peak() as peak:
        first = _filled(64 * MIB)
        second = first.clone()
        del first, second
    assert 128 * MIB - RESOLUTION <= peak.host < 128 * MIB + 4 * MIB


def test_memory_held_before_the_block_is_baseline_not_peak() -> None:
    held = _filled(96 * MIB)
    with measure_peak() as peak:
        extra = _filled(16 * MIB)
    assert 16 * MIB - RESOLUTION <= peak.host < 16 * MIB + 4 * MIB
    del held, extra


def test_memory_freed_before_the_block_is_reused_without_hiding_the_peak() -> None:
    # Many small tensors leave the heap with free pages; the probe hands them back first,
    # so a block that allocates as much again shows it.
    small = [_filled(4096) for _ in range(8192)]
    del small
    with measure_peak() as peak:
        again = [_filled(4096) for _ in range(8192)]
    assert peak.host >= 32 * MIB - RESOLUTION
    del again


# A process's history of large tensors, then a block that frees each tensor before making
# the next (as a gather on a rank outside ranks_only does): it holds 11 MiB at most.
_HISTORY_THEN_ONE_AT_A_TIME = """
import torch
from harness.memory import measure_peak
MIB = 2**20
def filled(size):
    return torch.ones(size // 4)
torch.ones(2**22).add_(1)
filled(32 * MIB)  # freed at once: by default glibc now puts blocks up to 32 MiB in the heap
earlier, pins = [], []
for k in range(8):
    earlier.append(filled((4 + k) * MIB))
    pins.append(filled(64 * 1024))  # keeps the chunk after it from merging into the top
del earlier
with measure_peak() as peak:
    for k in range(8):
        filled((4 + k) * MIB - 4096)
print(peak.host)
"""


def _peak_of_a_process(allocator_env: dict[str, str]) -> int:
    env = {name: value for name, value in os.environ.items() if not name.startswith("MALLOC_")}
    run = subprocess.run(
        [sys.executable, "-c", _HISTORY_THEN_ONE_AT_A_TIME],
        env=env | allocator_env,
        capture_output=True,
        text=True,
        check=True,
    )
    return int(run.stdout.split()[-1])


@pytest.mark.slow
@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator settings")
def test_large_tensors_freed_earlier_do_not_inflate_a_process_started_as_ranks_are() -> None:
    # Without it the block's tensors land in the trimmed chunks the earlier ones left, one
    # after another: measured 60.0 MiB (the sum) with this machine's glibc, 14.1 MiB with an
    # H200 machine's, instead of the largest.
    largest = 11 * MIB - 4096
    assert largest - RESOLUTION <= _peak_of_a_process(ALLOCATOR_ENV) < largest + 2 * MIB


@pytest.mark.slow
def test_a_reading_is_low_by_at_most_the_resolution() -> None:
    # Blocks of exactly 2 MiB in tensors the allocator maps on their own, many times over:
    # the kernel's batched page counts make some readings low, none by more than stated.
    readings = []
    for _ in range(50):
        with measure_peak() as peak:
            block = [_filled(256 * 1024) for _ in range(8)]
            del block
        readings.append(peak.host)
    assert min(readings) >= 2 * MIB - RESOLUTION, sorted(readings)[:5]


def test_transparent_huge_pages_are_off_while_measuring() -> None:
    # A huge page faulted for a new thread's stack or heap would count 2 MiB for a few kB.
    status = Path("/proc/self/status").read_text()
    if "THP_enabled:" not in status:
        pytest.skip("this kernel does not report THP_enabled in /proc/self/status")
    with measure_peak():
        pass
    status = Path("/proc/self/status").read_text()
    assert "THP_enabled:\t0" in status


def test_peaks_describe_themselves_in_mib() -> None:
    assert Peak("cpu", host=8 * MIB + MIB // 2).describe() == "host 8.5 MiB"
    assert Peak("cuda", host=0, device=3 * MIB).describe() == "host 0.0 MiB, cuda 3.0 MiB"


@pytest.mark.skipif(devices.accelerator() is None, reason="no accelerator in this build or machine")
def test_an_accelerator_block_reports_its_device_peak() -> None:
    device_type = str(devices.accelerator())
    with measure_peak(device_type) as peak:
        on_device = _filled(64 * MIB, device_type)
        del on_device
    assert peak.device is not None
    assert 64 * MIB <= peak.device < 64 * MIB + 4 * MIB


def test_another_allocator_is_named_as_missing_a_premise(monkeypatch: pytest.MonkeyPatch) -> None:
    # jemalloc or tcmalloc keep heaps and thresholds of their own: glibc's fixed mmap
    # threshold no longer keeps large tensors out of a reused heap, so readings would differ.
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
    assert host_probe_missing() == (
        "peak host memory needs glibc's malloc; LD_PRELOAD loads another: "
        "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
    )
    monkeypatch.delenv("LD_PRELOAD")
    monkeypatch.setattr(platform, "libc_ver", lambda: ("musl", "1.2.4"))
    assert host_probe_missing() == (
        "peak host memory needs glibc's malloc and its mmap threshold; this C library is musl"
    )


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: nothing to hold")
def test_the_block_holds_every_thread_and_gives_its_cpus_back_even_after_raising() -> None:
    """A process of one intra-op thread is held on one CPU while measuring, every thread of
    it; afterwards each has its own CPUs again, also when the block raised."""
    import threading

    started, stop = threading.Event(), threading.Event()

    def waits() -> None:
        started.set()
        stop.wait()

    worker = threading.Thread(target=waits)
    worker.start()
    started.wait()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        before = {tid: os.sched_getaffinity(tid) for tid in map(int, os.listdir("/proc/self/task"))}
        held: list[set[int]] = []

        def measured_block_that_raises() -> None:
            with measure_peak():
                held.append(os.sched_getaffinity(worker.native_id))
                raise RuntimeError("inside the block")

        with pytest.raises(RuntimeError, match="inside the block"):
            measured_block_that_raises()
        assert [len(cpus) for cpus in held] == [1]
        assert {tid: os.sched_getaffinity(tid) for tid in before} == before
    finally:
        torch.set_num_threads(threads)
        stop.set()
        worker.join()
