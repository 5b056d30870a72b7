"""Benchmarks of the torch build's state-dict operations, timed inside a world.

Each case runs on every rank: one warm-up round, then ``--bench-rounds`` rounds of
barrier, time, maximum over ranks (more for a short case, until they add up to
``--bench-seconds``), then one round whose peak memory each rank measures
over its own baseline (``harness.memory``; the largest rank's, host and device, goes to the
benchmark's ``extra_info`` as ``peak_host_bytes`` and ``peak_device_bytes``).
pytest-benchmark records the ranks' timings through a replay clock, so ``--benchmark-json``
holds them with its usual statistics. Under ``ci.bench.compare`` each of those steps (the
set-up, each round) takes turns with the other build's run (``ci.bench.lockstep``), and
both runs time as many rounds of a case as the one that wants more.

    python -m pytest ci/bench/benchmarks --benchmark-json=bench.json [--bench-sizes-mib 4,32]
"""

from __future__ import annotations

from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from ci.bench.cases import BenchCase
from ci.bench.replay_clock import CLOCK
from ci.bench.world import run_timed, write_timings

# A short case's rounds go on past --bench-rounds until they add up to --bench-seconds, up to
# this many: its rounds vary the most, and cost the least.
MOST_ROUNDS = 64


def measure(world: Any, case: BenchCase, rounds: int, budget_s: float, workdir: str) -> None:
    """Runs on every rank: time ``case`` for ``rounds`` rounds, and more while they add up to
    less than ``budget_s`` (in lockstep, as many as the other build's run wants too), then
    measure its peak memory; rank 0 hands back the slowest rank's seconds and the largest
    rank's peak."""
    from ci.bench.lockstep import step, timed_rounds
    from ci.bench.ops import prepare
    from ci.bench.world_timing import peak_max_over_ranks, time_max_over_ranks

    with step(world):
        operation = prepare(case, world, Path(workdir))
    with step(world):
        time_max_over_ranks(world, operation.run, operation.finish)  # warm-up: caches, lazy init
    seconds: list[float] = []

    def wanted() -> bool:
        return len(seconds) < rounds or (sum(seconds) < budget_s and len(seconds) < MOST_ROUNDS)

    with closing(timed_rounds(world, wanted)) as rounds_of_the_case:
        for _ in rounds_of_the_case:
            seconds.append(time_max_over_ranks(world, operation.run, operation.finish))
    with step(world):
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
    params = {
        "case": case,
        "rounds": request.config.getoption("bench_rounds"),
        "budget_s": request.config.getoption("bench_seconds"),
        "workdir": str(bench_workdir),
    }
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
