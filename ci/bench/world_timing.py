"""Timing inside a world: barrier, run, and the slowest rank's seconds."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def time_max_over_ranks(world: Any, action: Callable[[], object]) -> float:
    """Seconds ``action`` took on the slowest rank, after a barrier that lines the ranks up.

    On an accelerator the clock stops once the device has finished what ``action`` queued.
    """
    import torch
    import torch.distributed as dist

    from harness.devices import synchronize

    world.barrier()
    synchronize(world.device_type)
    start = time.perf_counter()
    action()
    synchronize(world.device_type)
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item())
