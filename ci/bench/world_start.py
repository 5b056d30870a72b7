"""What a world costs to start, with ranks forked from templates and with ranks spawned.

A world is replaced whenever a test leaves it unfit for the next (a failure out of step, a
crash, a hang, a test that asks for a fresh one, a test marked ``world_alone``), and a gate
replaces hundreds. Each replacement pays for starting its ranks and for their first test,
which imports the test module and what it imports (torch's distributed packages, the oracle).
Here a world of each size and mode starts ``--starts`` times and runs one test of a module
that imports what the suite's modules import; a start's cost is from asking for the world to
the end of that test. The first start of a mode is reported apart (under ``fork`` it also
starts the templates, once a session); the median of the others is the cost of a replacement.
Modes alternate, so both see the same machine.

    python -m ci.bench.world_start [--sizes 2,4] [--starts 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from harness import ForkServers, TestRequest, WorldPool, WorldSettings, WorldSpec

BODY = """\
import torch
import torch.distributed as dist
import torch.distributed.checkpoint  # noqa: F401 - what the suite's modules import
import torch.distributed.fsdp  # noqa: F401
import torch.distributed.tensor  # noqa: F401

import reference_impl  # noqa: F401


def test_all_reduce(world):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == world.size
"""
MODES = ("fork", "spawn")


def start_seconds(pool: WorldPool, spec: WorldSpec, module: Path, tmp: Path) -> float:
    """Seconds from asking for a fresh world of ``spec`` to the end of its first test."""
    request = TestRequest.of(
        module_name=module.stem,
        module_path=str(module),
        qualname="test_all_reduce",
        params={},
        tmp_path=str(tmp),
        timeout_s=300,
    )
    start = time.perf_counter()
    outcome = pool.run(spec, request, alone=True)
    elapsed = time.perf_counter() - start
    if outcome.verdict != "passed":
        raise RuntimeError(f"{spec.label}: the first test did not pass\n{outcome.failure_report()}")
    return elapsed


def measure(sizes: list[int], starts: int, tmp: Path) -> dict[tuple[str, int], list[float]]:
    """Each mode's start times at each size, modes alternating start by start."""
    module = tmp / "bench_world_start_body.py"
    module.write_text(BODY)
    settings = WorldSettings(sys_path=[str(tmp), *sys.path], rootdir=str(tmp), inifile=None)
    templates = ForkServers(tmp / "templates", settings, ((module.stem, str(module)),))
    pools = {"fork": WorldPool(settings, templates=templates), "spawn": WorldPool(settings)}
    seconds: dict[tuple[str, int], list[float]] = {(m, s): [] for m in MODES for s in sizes}
    try:
        for size in sizes:
            spec = WorldSpec("gloo", size, "cpu")
            for _ in range(starts):
                for mode in MODES:
                    seconds[mode, size].append(start_seconds(pools[mode], spec, module, tmp))
    finally:
        for pool in pools.values():
            pool.close()
    return seconds


def report(seconds: dict[tuple[str, int], list[float]], sizes: list[int]) -> list[str]:
    """Per size: each mode's first start and median replacement, and spawn / fork."""
    lines = []
    for size in sizes:
        lines.append(f"world size {size}:")
        medians = {}
        for mode in MODES:
            first, *rest = seconds[mode, size]
            medians[mode] = statistics.median(rest)
            lines.append(
                f"  {mode:<6} first start {first:6.2f} s, then {medians[mode]:6.2f} s per world "
                f"(median of {len(rest)})"
            )
        lines.append(f"  spawn / fork = {medians['spawn'] / medians['fork']:.1f}x per world")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2,4", help="world sizes (default 2,4)")
    parser.add_argument("--starts", type=int, default=5, help="worlds per mode and size (>= 2)")
    args = parser.parse_args(argv)
    if args.starts < 2:
        parser.error("--starts needs at least 2: the first start is reported apart")
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        print("\n".join(report(measure(sizes, args.starts, Path(tmp)), sizes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
