"""Timing inside a world: barrier, run, and the slowest rank's seconds."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any


def time_max_over_ranks(world: Any, action: Callable[[], object]) -> float:
    """Seconds ``action`` took on the slowest rank, after a barrier that lines the ranks up.

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
        action()
        synchronize(world.device_type)
        stop = time.perf_counter()
    finally:
        gc.enable()
    elapsed = torch.tensor([stop - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item())
