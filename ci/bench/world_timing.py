"""Timing inside a world: barrier, run, and the slowest rank's seconds."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def time_max_over_ranks(world: Any, action: Callable[[], object]) -> float:
    """Seconds ``action`` took on the slowest rank, after a barrier that lines the ranks up."""
    import torch
    import torch.distributed as dist

    world.barrier()
    start = time.perf_counter()
    action()
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item())
