"""The oracle's utilities against the torch build's: cases, their inputs, and the ratios.

Each case is one utility on a float32 state dict of a given size, laid out as many small
tensors (a model's state dict) or a few large ones. Its implementations (torch's function,
the oracle's, and for copy and offload one plain ``Tensor.copy_`` of the same bytes) are
timed interleaved in one world, so the ratios compare like with like.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MIB = 1 << 20
SMALL_TENSOR_BYTES = 64 * 1024
FEW_TENSORS = 4
LAYOUTS = ("many", "few")
DEFAULT_SIZES_MIB = (64, 512)

# Each operation: torch's function in torch.distributed._state_dict_utils, the oracle's name.
OPERATIONS = {
    "copy": ("_copy_state_dict", "copy_state_dict"),
    "offload": ("_offload_state_dict_to_cpu", "offload_state_dict_to_cpu"),
    "create_cpu": ("_create_cpu_state_dict", "create_cpu_state_dict"),
    "gather": ("_gather_state_dict", "gather_state_dict"),
}
TORCH, ORACLE, PLAIN_COPY = "torch", "oracle", "plain_copy"
# Operations that move bytes to the CPU, timed against a plain copy of the same bytes.
COPYING = ("copy", "offload")


@dataclass(frozen=True)
class OracleCase:
    """``op`` on ``size_mib`` of float32 state in the ``layout`` of its tensors."""

    op: str
    size_mib: int
    layout: str

    def __post_init__(self) -> None:
        if self.op not in OPERATIONS:
            raise ValueError(f"unknown operation {self.op!r}; known: {sorted(OPERATIONS)}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"{self.op}: layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.size_mib < 1:
            raise ValueError(f"{self.op}: size must be at least 1 MiB, got {self.size_mib}")

    @property
    def name(self) -> str:
        return f"{self.op}-{self.size_mib}MiB-{self.layout}"

    @property
    def implementations(self) -> tuple[str, ...]:
        return (TORCH, ORACLE, PLAIN_COPY) if self.op in COPYING else (TORCH, ORACLE)


def cases(sizes_mib: tuple[int, ...] = DEFAULT_SIZES_MIB) -> list[OracleCase]:
    """Every operation at every size in both layouts."""
    combinations = itertools.product(OPERATIONS, sizes_mib, LAYOUTS)
    return [OracleCase(op, size, layout) for op, size, layout in combinations]


def _state_dict(case: OracleCase, world: Any) -> dict[str, Any]:
    """The case's tensors on the world's device; ``Shard(0)`` DTensors for gather."""
    import torch
    from torch.distributed.tensor import Shard, distribute_tensor

    total = case.size_mib * MIB
    count = total // SMALL_TENSOR_BYTES if case.layout == "many" else FEW_TENSORS
    rows = world.size * 16
    columns = total // count // 4 // rows
    mesh = world.mesh(world.size, ("dp",)) if case.op == "gather" else None
    state: dict[str, Any] = {}
    for index in range(count):
        tensor = torch.full((rows, columns), float(index), device=world.device)
        state[f"layer{index}.weight"] = (
            distribute_tensor(tensor, mesh, [Shard(0)]) if mesh is not None else tensor
        )
    return state


def actions(case: OracleCase, world: Any) -> dict[str, Callable[[], object]]:
    """On each rank: every implementation of ``case``, its inputs ready."""
    import torch

    import reference_impl
    from conformance import sdu

    torch_name, oracle_name = OPERATIONS[case.op]
    theirs = sdu.get(torch_name)
    ours = getattr(reference_impl, oracle_name)
    state = _state_dict(case, world)
    if case.op == "copy":
        companion = reference_impl.create_cpu_state_dict(state)
        found = {TORCH: lambda: theirs(state, companion), ORACLE: lambda: ours(state, companion)}
    else:
        found = {TORCH: lambda: theirs(state), ORACLE: lambda: ours(state)}
    if case.op in COPYING:
        source = torch.ones(case.size_mib * MIB // 4, device=world.device)
        target = torch.empty(source.shape)
        found[PLAIN_COPY] = lambda: target.copy_(source)
    return found


def _median_ms(timings: dict[str, list[float]], implementation: str) -> float:
    return statistics.median(timings[implementation]) * 1000


def summary_line(case: OracleCase, world_size: int, timings: dict[str, list[float]]) -> str:
    """Medians, the ratio oracle / torch, and copy throughput against a plain copy."""
    torch_ms, oracle_ms = _median_ms(timings, TORCH), _median_ms(timings, ORACLE)
    line = (
        f"{case.name:<22} w{world_size}  torch {torch_ms:9.2f} ms  oracle {oracle_ms:9.2f} ms"
        f"  oracle/torch {oracle_ms / torch_ms:5.2f}"
    )
    if PLAIN_COPY in timings:
        plain_ms = _median_ms(timings, PLAIN_COPY)
        line += (
            f"  throughput vs plain copy_: oracle {plain_ms / oracle_ms:4.0%},"
            f" torch {plain_ms / torch_ms:4.0%}"
        )
    return line
