"""Peak memory of one operation on one rank, over that rank's own baseline.

On the host the probe reads the process's resident set: writing ``5`` to
``/proc/self/clear_refs`` resets its high-water mark (``VmHWM`` in ``/proc/self/status``) to
the current resident set, which is the baseline; after the operation ``VmHWM`` minus the
baseline is the peak. Before the reset the probe collects garbage and, with glibc, returns
free heap pages to the system (``malloc_trim``), so that the operation's allocations show in
the resident set instead of reusing pages freed earlier, and turns transparent huge pages off
for the process (a huge page faulted for a thread's stack or a new heap would count 2 MiB for
the few kB written). This needs Linux; elsewhere :func:`host_probe_missing` says why and
callers skip.

Large tensors must never have lived in the heap: a freed one leaves a free chunk there whose
pages the trim hands back, and a later allocation that lands in it faults them in again, so a
loop that frees each tensor before the next reads as the sum of its tensors, not the largest.
glibc puts a large block in the heap once its mmap threshold has risen (it rises with each
large free), and only a threshold fixed before the first allocation keeps them all out:
processes that measure start with :data:`ALLOCATOR_ENV` (the harness's rank processes do).

The kernel counts resident pages in per-CPU batches and takes the high-water mark from the
folded count, so a reading can miss up to a batch of pages on each CPU the process ran on.
The probe holds every thread of the process on as many CPUs as it has intra-op threads (one
in a rank), the CPU it measures from first, while the block runs: the counts pending on other
CPUs then stand still and cancel out, and the host figure is good to
:func:`host_resolution_bytes` (a batch grows with the CPUs online, slowly), on a runner of
many cores as on two (in the runs measured here, it read low, never high). Its premises are
glibc's malloc (the mmap threshold below) and Linux's per-CPU counters (6.2 on):
:func:`host_probe_missing` names a machine that breaks one, and callers skip.

On an accelerator the probe also reads the build's peak-allocated statistic for the current
device (``torch.accelerator`` where the build has its memory functions, else the device
module, e.g. ``torch.cuda``), reset the same way: peak allocated minus allocated at the
reset. Tensors of a CPU world live in the host figure only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import os
import platform
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from harness.devices import CPU, synchronize

_STATUS: Final = Path("/proc/self/status")
_CLEAR_REFS: Final = Path("/proc/self/clear_refs")
_RESET_PEAK: Final = "5"  # clear_refs: reset the peak resident set size to the current one
_M_MMAP_THRESHOLD: Final = -3  # mallopt's parameter number (malloc.h)
_PR_SET_THP_DISABLE: Final = 41  # prctl's option number (linux/prctl.h)
MMAP_THRESHOLD_BYTES: Final = 128 * 1024
# glibc reads this when a process starts: every block of the threshold or more is mapped on
# its own and unmapped when freed, from the first allocation on.
ALLOCATOR_ENV: Final = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD_BYTES)}
# Allocators loaded in place of glibc's malloc, which keep their own heaps and thresholds.
_OTHER_ALLOCATORS: Final = ("jemalloc", "tcmalloc", "mimalloc", "hoard", "snmalloc")


# Linux counts a process's resident pages per CPU from 6.2 on; before, per thread, in counts
# that holding threads on CPUs does not bound.
PER_CPU_COUNTS_SINCE: Final = (6, 2)


def _rss_batch_pages() -> int:
    """Linux's batch of a per-CPU counter (``percpu_counter_batch``): pages a CPU may count
    before they reach the total the high-water mark reads, ``max(32, 2 x CPUs online)``."""
    return max(32, 2 * os.sysconf("SC_NPROCESSORS_ONLN"))


def _kernel_release() -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", platform.release())
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def host_resolution_bytes(threads: int | None = None) -> int:
    """The host figure's resolution for a process of ``threads`` intra-op threads (default:
    this process's, which imports torch): up to a batch of pages pending on each CPU the probe
    holds its threads on, in each of the three counts the resident set sums (anonymous, file
    and shared pages), at the baseline and at the peak, either way. A rank of one thread: 768
    KiB with 4 KiB pages and up to 16 CPUs online. Measured on 2 CPUs (kernel 6.18): blocks of
    2 MiB in tensors mapped on their own read up to 268 KiB low held on one CPU, and up to 412
    KiB low left to migrate; none read high."""
    return 2 * 3 * _rss_batch_pages() * _cpus_to_hold(threads) * os.sysconf("SC_PAGE_SIZE")


def _cpus_to_hold(threads: int | None) -> int:
    """One CPU per intra-op thread, as many as the process may run on: fewer would leave
    threads that spin while they wait (OpenMP's do) taking turns on one CPU."""
    if threads is None:
        import torch

        threads = torch.get_num_threads()
    return max(1, min(threads, len(_allowed_cpus())))


def _allowed_cpus() -> set[int]:
    affinity = getattr(os, "sched_getaffinity", None)
    return set(affinity(0)) if affinity is not None else set(range(os.cpu_count() or 1))


_TASKS: Final = Path("/proc/self/task")
_THREAD_STAT: Final = Path("/proc/thread-self/stat")
_PROCESSOR_FIELD: Final = 36  # "processor" (field 39 of stat) after the name's ")"


@dataclass
class Peak:
    """What one rank held at most during the operation, in bytes over its baseline: ``host``
    from the resident set, ``device`` from the accelerator's allocator (None in a CPU
    world). Filled when the ``with`` block ends."""

    device_type: str
    host: int = 0
    device: int | None = None

    def describe(self) -> str:
        figures = [f"host {mib(self.host)}"]
        if self.device is not None:
            figures.append(f"{self.device_type} {mib(self.device)}")
        return ", ".join(figures)


def mib(size: int) -> str:
    """``size`` bytes in MiB, for messages."""
    return f"{size / 2**20:.1f} MiB"


def host_probe_missing() -> str | None:
    """Why this machine cannot measure a host peak as the probe's premises need, or None
    where it can."""
    if not _STATUS.exists() or not _CLEAR_REFS.exists():
        return "peak host memory needs Linux's /proc/self/clear_refs and VmHWM"
    if _kernel_release() < PER_CPU_COUNTS_SINCE:
        return (
            "peak host memory needs Linux 6.2 or later, which counts resident pages per CPU; "
            f"this kernel is {platform.release()}"
        )
    libc, _ = platform.libc_ver()
    if libc != "glibc":
        return (
            "peak host memory needs glibc's malloc and its mmap threshold; this C library is "
            f"{libc or 'unknown'}"
        )
    preloaded = os.environ.get("LD_PRELOAD", "")
    if any(name in preloaded for name in _OTHER_ALLOCATORS):
        return f"peak host memory needs glibc's malloc; LD_PRELOAD loads another: {preloaded}"
    try:
        _CLEAR_REFS.write_text(_RESET_PEAK)
    except OSError as error:
        return f"cannot reset the peak resident set ({error})"
    return None


@contextmanager
def measure_peak(device_type: str = CPU) -> Iterator[Peak]:
    """Measure the peak memory of the ``with`` block on this rank: its host resident set and,
    for an accelerator ``device_type``, the device's allocated memory, each over the
    baseline at entry. Queued device work is waited for on both sides of the block."""
    peak = Peak(device_type)
    synchronize(device_type)
    device_baseline = _reset_device(device_type)
    with _threads_held(_cpus_to_hold(None)):
        host_baseline = _reset_host()
        yield peak
        synchronize(device_type)
        peak.host = max(0, _status_bytes("VmHWM") - host_baseline)
    if device_baseline is not None:
        peak.device = max(
            0, int(_device_memory(device_type, "max_memory_allocated")) - device_baseline
        )


@contextmanager
def _threads_held(count: int) -> Iterator[None]:
    """Hold every thread of this process on ``count`` CPUs, the one this thread runs on
    first (a thread started later inherits the CPUs of the thread that starts it); afterwards
    each thread gets its own CPUs back, a thread started meanwhile this one's."""
    if not hasattr(os, "sched_setaffinity") or not _THREAD_STAT.exists():
        yield
        return
    here = int(_THREAD_STAT.read_text().rsplit(")", 1)[1].split()[_PROCESSOR_FIELD])
    whole = os.sched_getaffinity(0)
    held = {here, *sorted(whole - {here})[: count - 1]}
    before: dict[int, set[int] | None] = {}  # None: a thread that could not be moved
    try:
        for tid in _threads():
            before[tid] = _set_affinity(tid, held)
        yield
    finally:
        for tid in _threads():
            if tid not in before:  # started while held
                _set_affinity(tid, whole)
            elif (cpus := before[tid]) is not None:
                _set_affinity(tid, cpus)


def _threads() -> list[int]:
    return [int(name) for name in os.listdir(_TASKS)]


def _set_affinity(tid: int, cpus: set[int]) -> set[int] | None:
    """Give thread ``tid`` ``cpus``; its CPUs before, or None where it has ended or may not
    be moved (another cgroup's CPUs, no permission): it is then left where it was."""
    try:
        before = os.sched_getaffinity(tid)
        os.sched_setaffinity(tid, cpus)
    except OSError:
        return None
    return before


def _reset_host() -> int:
    # A full collection also resets the collector's counts: what an operation leaves in
    # reference cycles is then freed at the same point of every run.
    gc.collect()
    _settle_the_heap()
    _CLEAR_REFS.write_text(_RESET_PEAK)
    return _status_bytes("VmRSS")


def _settle_the_heap() -> None:
    """Small pages for the process; with glibc, a fixed mmap threshold (for a process that
    did not start with :data:`ALLOCATOR_ENV`: from now on) and free heap pages returned
    (other C libraries return memory on their own terms)."""
    libc = _libc()
    if libc is None:
        return
    if hasattr(libc, "prctl"):
        libc.prctl(_PR_SET_THP_DISABLE, 1, 0, 0, 0)
    if hasattr(libc, "malloc_trim"):
        libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        libc.malloc_trim(0)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name is not None else None


def _status_bytes(field: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{_STATUS} has no {field} line")


def _reset_device(device_type: str) -> int | None:
    if device_type == CPU:
        return None
    _device_memory(device_type, "reset_peak_memory_stats")
    return int(_device_memory(device_type, "memory_allocated"))


def _device_memory(device_type: str, function: str) -> Any:
    """Call the memory statistic ``function`` of the current ``device_type`` device."""
    import torch

    api = getattr(torch, "accelerator", None)
    current = api.current_accelerator() if api is not None and api.is_available() else None
    if current is not None and current.type == device_type and hasattr(api, function):
        return getattr(api, function)()
    return getattr(torch.get_device_module(device_type), function)()
