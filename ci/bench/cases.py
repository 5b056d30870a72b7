"""The benchmark cases: which state-dict operation, on what, at which size."""

from __future__ import annotations

from dataclasses import dataclass

from conformance import dcp, dsd, sdu

STATE_DICT_UTILS, DSD, DCP = sdu.path, dsd.path, dcp.path

# Each operation and the torch function it times (what a slowdown injection patches).
UTILITY_OPS = {
    "gather": (STATE_DICT_UTILS, "_gather_state_dict"),
    "offload": (STATE_DICT_UTILS, "_offload_state_dict_to_cpu"),
    "copy": (STATE_DICT_UTILS, "_copy_state_dict"),
    "create_cpu": (STATE_DICT_UTILS, "_create_cpu_state_dict"),
    "broadcast": (STATE_DICT_UTILS, "_broadcast_state_dict"),
    "distribute": (STATE_DICT_UTILS, "_distribute_state_dict"),
}
MODEL_OPS = {
    "get_state_dict": (DSD, "get_state_dict"),
    "set_state_dict": (DSD, "set_state_dict"),
    "dcp_save": (DCP, "save"),
    "dcp_load": (DCP, "load"),
    "async_save": (DCP, "async_save"),  # the caller's blocking part: staging, not the write
    "resharded_load": (DCP, "load"),  # a checkpoint another parallelism wrote
}
OPS = {**UTILITY_OPS, **MODEL_OPS}
# The default cells of the model operations; any cell of conformance's matrix may be named.
DEFAULT_PARALLELISMS = ("ddp", "fsdp1_full_shard_orig", "fsdp2", "tp")
DEFAULT_SIZES_MIB = (4, 16)


def known_parallelisms(world_size: int) -> tuple[str, ...]:
    """The matrix's cells that run at ``world_size``."""
    from conformance import PARALLELISMS

    return tuple(name for name, cell in PARALLELISMS.items() if cell.supports(world_size))


@dataclass(frozen=True)
class BenchCase:
    """One benchmark: ``op`` on ``size_mib`` of float32 state; model operations also name
    the parallelism of the model whose state dict they take."""

    op: str
    size_mib: int
    parallelism: str | None = None

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"unknown operation {self.op!r}; known: {sorted(OPS)}")
        if self.size_mib < 1:
            raise ValueError(f"{self.op}: size must be at least 1 MiB, got {self.size_mib}")
        if (self.op in MODEL_OPS) != (self.parallelism is not None):
            raise ValueError(f"{self.op}: a parallelism is needed exactly for model operations")

    @property
    def name(self) -> str:
        cell = f"-{self.parallelism}" if self.parallelism else ""
        return f"{self.op}{cell}-{self.size_mib}MiB"


def async_saves(parallelism: str) -> bool:
    """Whether ``async_save`` is timed on the cell: from 2.12 its own stager cannot stage the
    ShardedTensors of FSDP1 on process groups (conformance's record
    ``defaultstager-cannot-stage-sharded-tensors``), and a comparison needs the same
    benchmarks on every release."""
    from conformance import PARALLELISMS

    cell = PARALLELISMS[parallelism]
    return not (cell.fsdp1 and not cell.fsdp1_mesh)


def cases(
    sizes_mib: tuple[int, ...] = DEFAULT_SIZES_MIB,
    parallelisms: tuple[str, ...] = DEFAULT_PARALLELISMS,
) -> list[BenchCase]:
    """Every utility at every size, and every model operation for every parallelism that
    can run it."""
    found = [BenchCase(op, size) for op in UTILITY_OPS for size in sizes_mib]
    found += [
        BenchCase(op, size, parallelism)
        for op in MODEL_OPS
        for parallelism in parallelisms
        for size in sizes_mib
        if op != "async_save" or async_saves(parallelism)
    ]
    return found
