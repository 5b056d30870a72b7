"""Measuring inside a world: the slowest rank's seconds, and the largest rank's peak memory."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any


def time_max_over_ranks(
    world: Any, action: Callable[[], object], finish: Callable[[object], object] | None = None
) -> float:
    """Seconds ``action`` took on the slowest rank, after a barrier that lines the ranks up.
    ``finish`` gets what ``action`` returned once the clock has stopped, and completes it
    before any collective of the round (an async save's write, whose thread has collectives
    of its own).

    On an accelerator the clock stops once the device has finished what ``action`` queued.
    Python's cyclic garbage collector does not run inside the timed window: objects alive
    before it are frozen out of its scans, and collection waits until the clock has stopped
    (a collection landing in some rounds and not others was a quarter of the rounds' spread).
    """
    import torch
    import torch.distributed as dist

    from harness.devices import synchronize

    gc.freeze()
    world.barrier()
    synchronize(world.device_type)
    gc.disable()
    try:
        start = time.perf_counter()
        result = action()
        synchronize(world.device_type)
        stop = time.perf_counter()
    finally:
        gc.enable()
    if finish is not None:
        finish(result)
    elapsed = torch.tensor([stop - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item())


def peak_max_over_ranks(
    world: Any, action: Callable[[], object], finish: Callable[[object], object] | None = None
) -> tuple[int | None, int | None]:
    """Bytes ``action`` and then ``finish`` of its result held at most over each rank's
    baseline, on the rank that held the most: on the host (None where ``harness.memory``
    cannot measure it) and on the device (None in a CPU world). What ``action`` returns is
    dropped after ``finish``, after the peak it made."""
    import torch
    import torch.distributed as dist

    from harness.memory import host_probe_missing, measure_peak

    measurable = host_probe_missing() is None
    world.barrier()
    if measurable:
        with measure_peak(world.device_type) as peak:
            result = action()
            if finish is not None:
                finish(result)
            del result
        figures = [peak.host, -1 if peak.device is None else peak.device]
    else:
        figures = [-1, -1]
    largest = torch.tensor(figures, dtype=torch.int64)
    dist.all_reduce(largest, op=dist.ReduceOp.MAX)
    host, device = (int(value) for value in largest.tolist())
    return (host if host >= 0 else None), (device if device >= 0 else None)
