"""The oracle's memory bounds: sums of the tensors' sizes by where they live, one process."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from reference_impl import peak_memory as bounds
from reference_impl.peak_memory import (
    ITEMS_IN_FLIGHT,
    PLAN_BYTES_PER_ITEM,
    TRANSIENT_FULL_TENSORS,
    TRANSIENT_UNITS,
    Footprint,
)

KIB = 1024
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    store = dist.FileStore(str(Path(tmp_path_factory.mktemp("store")) / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def floats(count: int) -> torch.Tensor:
    return torch.zeros(count, dtype=torch.float32)


def sharded(mesh: object, count: int) -> torch.Tensor:
    from torch.distributed.tensor import Shard, distribute_tensor

    return distribute_tensor(floats(count), mesh, [Shard(0)])


def test_plain_tensors_gather_to_themselves() -> None:
    state = {"a": floats(256), "nested": {"b": floats(512)}, "step": 3}
    bound = bounds.gather_state_dict_peak(state, rank=0)
    assert bound.result == Footprint()
    assert bound.transient == Footprint()
    assert (bound.largest_tensor, bound.whole_state_dict) == (2 * KIB, 3 * KIB)


def test_distributed_tensors_gather_whole_one_at_a_time(mesh: object) -> None:
    state = {"big": sharded(mesh, 1024), "small": sharded(mesh, 256), "plain": floats(256)}
    kept = bounds.gather_state_dict_peak(state, rank=0, ranks_only=(0,))
    assert kept.result == Footprint(host=5 * KIB)
    assert kept.transient == Footprint(host=TRANSIENT_FULL_TENSORS * 4 * KIB)
    dropped = bounds.gather_state_dict_peak(state, rank=1, ranks_only=(0,))
    assert dropped.result == Footprint()
    assert dropped.transient == kept.transient


def test_cpu_tensors_offload_to_themselves() -> None:
    bound = bounds.offload_state_dict_to_cpu_peak({"a": floats(256)}, rank=0)
    assert bound.result == Footprint()


def test_a_cpu_state_dict_holds_each_local_tensor_once(mesh: object) -> None:
    state = {"d": sharded(mesh, 512), "opt": [floats(256), torch.tensor(1.0)]}
    assert bounds.create_cpu_state_dict_peak(state).result == Footprint(host=3 * KIB + 4)
    assert bounds.copy_state_dict_peak(state).result == Footprint()


def test_a_broadcast_replaces_plain_tensors_and_fills_dtensors_in_place(mesh: object) -> None:
    bound = bounds.broadcast_state_dict_peak(
        {"d": sharded(mesh, 512), "p": floats(256), "zero_dim": torch.tensor(2.0)}, CPU
    )
    assert bound.result == Footprint(host=KIB)
    assert bound.transient == Footprint(host=TRANSIENT_FULL_TENSORS * 2 * KIB)


def test_a_distribution_gives_dtensors_new_pieces(mesh: object) -> None:
    bound = bounds.distribute_state_dict_peak({"d": sharded(mesh, 512), "p": floats(256)}, CPU)
    assert bound.result == Footprint(host=2 * KIB)


def test_a_cpu_world_counts_device_bytes_as_host_bytes() -> None:
    bound = bounds.PeakBound("op", Footprint(1, 2), Footprint(4, 8), 0, 0)
    assert bound.limit(16, separate_device=False) == Footprint(host=31)
    assert bound.limit(16, separate_device=True) == Footprint(host=21, device=26)


def test_a_unit_counts_its_tensors_whole_and_not_its_scalars(mesh: object) -> None:
    state = {"w": sharded(mesh, 1024), "b": floats(256), "step": torch.tensor(3.0)}
    assert bounds.unsharded_unit_bytes(state) == 5 * KIB


def test_get_state_dict_gathers_only_when_full(mesh: object) -> None:
    state = {"w": sharded(mesh, 1024), "b": floats(256)}
    held = bounds.get_state_dict_peak(state, rank=0, full_state_dict=False, cpu_offload=False)
    assert (held.result, held.transient) == (Footprint(), Footprint())
    full = bounds.get_state_dict_peak(state, rank=0, full_state_dict=True, cpu_offload=False)
    assert full.result == Footprint(host=4 * KIB)
    assert full.transient == Footprint(host=TRANSIENT_FULL_TENSORS * 4 * KIB)
    # Offloaded full state dicts stay on rank 0.
    other = bounds.get_state_dict_peak(state, rank=1, full_state_dict=True, cpu_offload=True)
    assert other.result == Footprint()


def test_fsdp1_state_dicts_are_new_copies_beside_an_unsharded_unit(mesh: object) -> None:
    state = {"w": sharded(mesh, 1024), "b": floats(256)}
    bound = bounds.get_state_dict_peak(
        state, rank=0, full_state_dict=False, cpu_offload=False, fsdp1_unit_bytes=5 * KIB
    )
    assert bound.result == Footprint(host=5 * KIB)
    assert bound.transient == Footprint(host=TRANSIENT_UNITS * 5 * KIB)


def test_an_fsdp1_unit_is_unsharded_where_its_tensors_live_not_its_step() -> None:
    # Adam's step stays on the host while the moments live on the device (meta stands in).
    optim_state = {"step": torch.tensor(1.0), "exp_avg": torch.empty(1024, device="meta")}
    bound = bounds.get_state_dict_peak(
        optim_state, rank=0, full_state_dict=False, cpu_offload=False, fsdp1_unit_bytes=4 * KIB
    )
    assert bound.transient == Footprint(device=TRANSIENT_UNITS * 4 * KIB)


def test_set_state_dict_receives_local_pieces_and_fsdp1_whole_tensors(mesh: object) -> None:
    targets = {"w": sharded(mesh, 1024), "step": torch.tensor(1.0)}
    plain = bounds.set_state_dict_peak(targets, device=CPU)
    assert plain.result == Footprint(host=4 * KIB)
    assert plain.transient == Footprint(host=TRANSIENT_FULL_TENSORS * 4 * KIB)
    fsdp1 = bounds.set_state_dict_peak(targets, device=CPU, fsdp1_unit_bytes=4 * KIB)
    assert fsdp1.transient == plain.transient + Footprint(host=TRANSIENT_UNITS * 4 * KIB)


def test_dcp_keeps_nothing_and_plans_every_item(mesh: object) -> None:
    # Four items: two tensors, a scalar and a list's one element.
    state = {"w": sharded(mesh, 1024), "p": floats(256), "opt": {"step": 3, "lr": [0.1]}}
    staged = ITEMS_IN_FLIGHT * 4 * KIB
    coordinator = bounds.dcp_save_peak(state, rank=0, world_size=2)
    assert coordinator.result == Footprint()
    assert coordinator.transient == Footprint(host=staged + 8 * PLAN_BYTES_PER_ITEM)
    other = bounds.dcp_save_peak(state, rank=1, world_size=2)
    assert other.transient == Footprint(host=staged + 4 * PLAN_BYTES_PER_ITEM)
    load = bounds.dcp_load_peak(state, world_size=2)
    assert (load.result, load.transient) == (Footprint(), coordinator.transient)


def test_fsdp1_optimizer_conversions_hold_a_unit_beside_their_result(mesh: object) -> None:
    held = {"w": sharded(mesh, 1024), "b": floats(256)}
    unit = 5 * KIB
    full = bounds.fsdp1_optim_state_dict_peak(held, rank=0, unit_bytes=unit)
    assert full.result == Footprint(host=4 * KIB)
    gathered = Footprint(host=TRANSIENT_FULL_TENSORS * 4 * KIB)
    assert full.transient == gathered + Footprint(host=TRANSIENT_UNITS * unit)
    elsewhere = bounds.fsdp1_optim_state_dict_peak(held, rank=1, unit_bytes=unit, rank0_only=True)
    assert elsewhere.result == Footprint()
    sharded_dict = bounds.fsdp1_optim_state_dict_peak(
        held, rank=1, unit_bytes=unit, shard_state=True
    )
    assert sharded_dict.result == Footprint(host=5 * KIB)
    assert sharded_dict.transient == Footprint(host=TRANSIENT_UNITS * unit)


def test_fsdp1_loads_gather_a_sharded_input_one_tensor_at_a_time(mesh: object) -> None:
    held = {"w": sharded(mesh, 1024), "b": floats(256)}
    full = bounds.fsdp1_optim_load_peak(held, unit_bytes=5 * KIB, shard_state=False)
    assert full.result == Footprint(host=5 * KIB)
    assert full.transient == Footprint(host=TRANSIENT_UNITS * 5 * KIB)
    from_shards = bounds.fsdp1_optim_load_peak(held, unit_bytes=5 * KIB, shard_state=True)
    assert from_shards.transient == full.transient + Footprint(
        host=TRANSIENT_FULL_TENSORS * 4 * KIB
    )
