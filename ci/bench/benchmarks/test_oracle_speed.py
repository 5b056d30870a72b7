"""The oracle's state-dict utilities against the torch build's, timed side by side.

For each case (copy, offload, CPU-state-dict creation and gather at ``--oracle-sizes-mib``,
many small tensors or a few large ones), every rank runs all its implementations
interleaved: one warm-up round, then ``--bench-rounds`` rounds, each implementation timed
by barrier, time, maximum over ranks. Each implementation is one benchmark, grouped by
case; the session ends with the ratios oracle / torch and the copy throughput against a
plain ``Tensor.copy_``.

    python -m pytest ci/bench/benchmarks/test_oracle_speed.py [--oracle-sizes-mib 64,512]

On a CPU world ``offload`` moves nothing (the tensors are already on the CPU): it times
the traversal alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ci.bench.oracle_cases import OracleCase
from ci.bench.replay_clock import CLOCK
from ci.bench.world import run_timed, write_timings


def measure_side_by_side(world: Any, case: OracleCase, rounds: int) -> None:
    """Runs on every rank: time each implementation of ``case``, interleaved."""
    from ci.bench.oracle_cases import actions
    from ci.bench.world_timing import time_max_over_ranks

    found = actions(case, world)
    for action in found.values():  # warm-up: page faults, caches, lazy init
        time_max_over_ranks(world, action)
    timings: dict[str, list[float]] = {name: [] for name in found}
    for _ in range(rounds):
        for name, action in found.items():
            timings[name].append(time_max_over_ranks(world, action))
    write_timings(world, timings)


@pytest.mark.benchmark(timer=CLOCK.now)
def test_oracle_speed(
    benchmark: Any,
    bench_world: Any,
    oracle_timings: dict[OracleCase, dict[str, list[float]]],
    oracle_case: OracleCase,
    implementation: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    if oracle_case not in oracle_timings:  # the first implementation measures them all
        rounds = request.config.getoption("bench_rounds")
        params = {"case": oracle_case, "rounds": rounds}
        oracle_timings[oracle_case] = run_timed(bench_world, measure_side_by_side, params, tmp_path)
    import torch

    benchmark.group = f"oracle-speed {oracle_case.name}"
    benchmark.extra_info.update(
        torch=torch.__version__,
        op=oracle_case.op,
        size_mib=oracle_case.size_mib,
        layout=oracle_case.layout,
        implementation=implementation,
        world_size=bench_world.spec.size,
        backend=bench_world.spec.backend,
    )
    timings = oracle_timings[oracle_case][implementation]
    benchmark.pedantic(CLOCK.replay_round, rounds=CLOCK.load(timings), iterations=1)
