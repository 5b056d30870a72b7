"""The oracle's state-dict utilities against the torch build's, timed side by side in worlds.

For copy, offload, CPU-state-dict creation and gather, on state dicts of
several sizes made of many small tensors or a few large ones, every rank of
a world runs torch's function and the oracle's, interleaved, ``--repeats``
times. Each timing is barrier, time, then the maximum over ranks. The
median of each is printed with the ratio oracle / torch, and the copy
throughput of both against one plain ``Tensor.copy_`` of the same bytes.

    python -m ci.bench_state_dict_utils [--sizes-mib 64,512] [--world-sizes 1,2] [--repeats 7]

On a CPU machine ``offload`` moves nothing (tensors are already on the CPU):
it times the traversal alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from ci._world_timing import time_max_over_ranks

MIB = 1 << 20
SMALL_TENSOR_BYTES = 64 * 1024
FEW_TENSORS = 4


def _state_dict(total_bytes: int, layout: str, world: Any, sharded: bool) -> dict[str, Any]:
    """float32 tensors of ``total_bytes`` in all: many of 64 KiB or four large ones."""
    import torch
    from torch.distributed.tensor import Shard, distribute_tensor

    count = total_bytes // SMALL_TENSOR_BYTES if layout == "many" else FEW_TENSORS
    numel = total_bytes // count // 4
    rows = world.size * 16
    state: dict[str, Any] = {}
    mesh = world.mesh(world.size, ("dp",)) if sharded else None
    for index in range(count):
        tensor = torch.full((rows, numel // rows), float(index))
        state[f"layer{index}.weight"] = (
            distribute_tensor(tensor, mesh, [Shard(0)]) if mesh is not None else tensor
        )
    return state


def bench_body(world: Any, case: str, size_mib: int, layout: str, repeats: int) -> None:
    """Runs on every rank: time torch and the oracle on ``case``; rank 0 writes the timings."""
    import torch
    from torch.distributed import _state_dict_utils as upstream

    import reference_impl as ri

    state = _state_dict(size_mib * MIB, layout, world, sharded=case == "gather")
    companion = ri.create_cpu_state_dict(state)
    if case == "copy":
        flat_source = torch.ones(size_mib * MIB // 4)
        flat_target = torch.empty_like(flat_source)
        pairs = {
            "torch": lambda: upstream._copy_state_dict(state, companion),
            "oracle": lambda: ri.copy_state_dict(state, companion),
            "plain copy_": lambda: flat_target.copy_(flat_source),
        }
    else:
        torch_name, oracle = {
            "offload": ("_offload_state_dict_to_cpu", ri.offload_state_dict_to_cpu),
            "create_cpu": ("_create_cpu_state_dict", ri.create_cpu_state_dict),
            "gather": ("_gather_state_dict", ri.gather_state_dict),
        }[case]
        theirs = getattr(upstream, torch_name)
        pairs = {
            "torch": lambda: theirs(state),
            "oracle": lambda: oracle(state),  # type: ignore[operator]
        }
    timings: dict[str, list[float]] = {name: [] for name in pairs}
    for action in pairs.values():  # warm-up: page faults, caches
        time_max_over_ranks(world, action)
    for _ in range(repeats):
        for name, action in pairs.items():
            timings[name].append(time_max_over_ranks(world, action))
    if world.rank == 0:
        (world.tmp_path / "timings.json").write_text(json.dumps(timings))


def _run(
    world_size: int, case: str, size_mib: int, layout: str, repeats: int
) -> dict[str, list[float]]:
    from harness import TestRequest, World, WorldSettings, WorldSpec

    settings = WorldSettings(
        sys_path=list(sys.path), rootdir=str(Path(__file__).parent), inifile=None
    )
    world = World(WorldSpec("gloo", world_size), settings)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            request = TestRequest(
                module_name="bench_state_dict_utils_bodies",
                module_path=__file__,
                qualname="bench_body",
                params={
                    "case": case,
                    "size_mib": size_mib,
                    "layout": layout,
                    "repeats": repeats,
                },
                tmp_path=tmp,
                timeout_s=1800,
            )
            outcome = world.run(request)
            if outcome.verdict != "passed":
                raise RuntimeError(outcome.failure_report())
            results = Path(tmp) / "timings.json"
            timings: dict[str, list[float]] = json.loads(results.read_text())
            return timings
    finally:
        world.close()


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def _line(
    case: str, size_mib: int, layout: str, world_size: int, timings: dict[str, list[float]]
) -> str:
    medians = {name: statistics.median(values) for name, values in timings.items()}
    cells = [
        f"{name} {_ms(medians[name]):>8} ms [{_ms(min(values))}-{_ms(max(values))}]"
        for name, values in timings.items()
    ]
    text = f"{case:<10} {size_mib:>4} MiB {layout:<4} w{world_size}: " + ", ".join(cells)
    text += f" | oracle/torch {medians['oracle'] / medians['torch']:.3f}"
    if "plain copy_" in medians:
        plain = medians["plain copy_"]
        text += (
            f" | vs plain copy_: torch {plain / medians['torch']:.0%},"
            f" oracle {plain / medians['oracle']:.0%}"
        )
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mib", default="64,512")
    parser.add_argument("--world-sizes", default="1,2")
    parser.add_argument("--cases", default="copy,offload,create_cpu,gather")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    for world_size in (int(s) for s in args.world_sizes.split(",")):
        for case in args.cases.split(","):
            for size_mib in (int(s) for s in args.sizes_mib.split(",")):
                for layout in ("many", "few"):
                    timings = _run(world_size, case, size_mib, layout, args.repeats)
                    print(_line(case, size_mib, layout, world_size, timings), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
