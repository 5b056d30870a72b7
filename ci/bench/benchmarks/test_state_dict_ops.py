"""Benchmarks of the torch build's state-dict operations, timed inside a world.

Each case runs on every rank: one warm-up round, then ``--bench-rounds`` rounds of
barrier, time, maximum over ranks, then one round whose peak memory each rank measures
over its own baseline (``harness.memory``; the largest rank's, host and device, goes to the
benchmark's ``extra_info`` as ``peak_host_bytes`` and ``peak_device_bytes``).
pytest-benchmark records the ranks' timings through a replay clock, so ``--benchmark-json``
holds them with its usual statistics.

    python -m pytest ci/bench/benchmarks --benchmark-json=bench.json [--bench-sizes-mib 4,32]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ci.bench.cases import BenchCase
from ci.bench.replay_clock import CLOCK
from ci.bench.world import run_timed, write_timings


def measure(world: Any, case: BenchCase, rounds: int, workdir: str) -> None:
    """Runs on every rank: time ``case``, then measure its peak memory; rank 0 hands back
    the slowest rank's seconds and the largest rank's peak."""
    from ci.bench.ops import prepare
    from ci.bench.world_timing import peak_max_over_ranks, time_max_over_ranks

    operation = prepare(case, world, Path(workdir))
    time_max_over_ranks(world, operation.run, operation.finish)  # warm-up: caches, lazy init
    seconds = [time_max_over_ranks(world, operation.run, operation.finish) for _ in range(rounds)]
    host, device = peak_max_over_ranks(world, operation.run, operation.finish)
    write_timings(world, {"seconds": seconds, "peak_host_bytes": host, "peak_device_bytes": device})


@pytest.mark.benchmark(timer=CLOCK.now, group="state-dict")
def test_state_dict_op(
    benchmark: Any,
    bench_world: Any,
    bench_workdir: Path,
    case: BenchCase,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    rounds = request.config.getoption("bench_rounds")
    params = {"case": case, "rounds": rounds, "workdir": str(bench_workdir)}
    measured = run_timed(bench_world, measure, params, tmp_path)
    import torch

    benchmark.extra_info.update(
        torch=torch.__version__,
        torch_git_hash=torch.version.git_version,
        op=case.op,
        size_mib=case.size_mib,
        parallelism=case.parallelism,
        world_size=bench_world.spec.size,
        backend=bench_world.spec.backend,
        peak_host_bytes=measured["peak_host_bytes"],
        peak_device_bytes=measured["peak_device_bytes"],
    )
    benchmark.pedantic(CLOCK.replay_round, rounds=CLOCK.load(measured["seconds"]), iterations=1)
