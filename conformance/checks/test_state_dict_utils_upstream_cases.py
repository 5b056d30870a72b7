"""Counterparts of upstream's ``test/distributed/checkpoint/test_state_dict_utils.py``.

Upstream runs these on CUDA only; here each case holds both the torch build and the oracle to
the case's expectation, on the rank's device. CPU state dicts are created from tensors on the
rank's device and must lie on the CPU, shared or pinned where asked and only there (a 0-dim
tensor is made a plain one); pinned memory skips where no accelerator is.
"""

from __future__ import annotations

import copy
import io
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist

import reference_impl as ri
from conformance._upstream import dtensor, sdu
from conformance.compare import assert_trees_identical


def both(name: str, oracle: Callable[..., Any]) -> list[tuple[str, Callable[..., Any]]]:
    return [("torch", sdu.get(name)), ("oracle", oracle)]


def rank_seeded_dtensor(world: Any) -> tuple[dtensor.DTensor, torch.Tensor]:
    """A Shard(0) DTensor of per-rank random 3x3x3 pieces, and their concatenation."""
    mesh = world.mesh(world.size, ("dp",))
    local = torch.randn(3, 3, 3, generator=torch.Generator().manual_seed(world.rank))
    pieces = [torch.empty_like(local) for _ in range(world.size)]
    dist.all_gather(pieces, local)
    return dtensor.DTensor.from_local(local, mesh, [dtensor.Shard(0)]), torch.cat(pieces)


@pytest.mark.world(2, 4)
def test_gather_state_dict_dtensor(world):
    for who, gather in both("_gather_state_dict", ri.gather_state_dict):
        dtensor, expected = rank_seeded_dtensor(world)
        gathered = gather({"dtensor": dtensor})
        assert torch.equal(gathered["dtensor"], expected), who
        assert gathered["dtensor"].device == world.device, who


@pytest.mark.world(4)
def test_gather_with_cpu_and_ranks_only(world):
    for who, gather in both("_gather_state_dict", ri.gather_state_dict):
        dtensor, expected = rank_seeded_dtensor(world)
        gathered = gather({"dtensor": dtensor}, cpu_offload=True, ranks_only=(0, 2))
        if world.rank in (0, 2):
            assert torch.equal(gathered["dtensor"], expected), who
            assert gathered["dtensor"].device.type == "cpu", who
        else:
            assert gathered == {}, who


@pytest.mark.world(4)
def test_cpu_and_ranks_only(world):
    for who, offload in both("_offload_state_dict_to_cpu", ri.offload_state_dict_to_cpu):
        state_dict = {
            "tensor1": torch.arange(10, device=world.device),
            "tensor2": torch.ones(10, device=world.device),
        }
        cpu_state_dict = offload(state_dict, ranks_only=(0, 2))
        if world.rank in (0, 2):
            assert all(v.device.type == "cpu" for v in cpu_state_dict.values()), who
            assert torch.equal(cpu_state_dict["tensor1"], torch.arange(10)), who
            assert torch.equal(cpu_state_dict["tensor2"], torch.ones(10)), who
        else:
            assert cpu_state_dict == {}, who


@pytest.mark.world(2, 4)
def test_complicated_dict(world):
    gathered_by = {}
    for who, gather in both("_gather_state_dict", ri.gather_state_dict):
        tensors, dtensors = [], []
        for _ in range(10):
            dtensor, full = rank_seeded_dtensor(world)
            tensors += [full, torch.ones(10, device=world.device)]
            dtensors += [dtensor, torch.ones(10, device=world.device)]
        dtensor, full = rank_seeded_dtensor(world)
        arange = torch.arange(10, device=world.device)
        gathered = gather({"local": dtensor, "list": dtensors, "arange": arange})
        assert_trees_identical(gathered, {"local": full, "list": tensors, "arange": arange})
        gathered_by[who] = gathered
    assert_trees_identical(gathered_by["torch"], gathered_by["oracle"])


def upstream_cpu_case(device: torch.device | None = None) -> tuple[dict[str, Any], io.BytesIO]:
    """Upstream's state dict for the CPU utilities, its tensors on ``device`` (the CPU by
    default), and the buffer it holds saved."""
    buffer = io.BytesIO()
    torch.save(torch.ones(10), buffer)
    buffer.seek(0)
    state_dict = {
        "tensor1": torch.arange(10, device=device),
        "tensor2": torch.ones(10, device=device),
        "non_tensor_bytes_io": copy.deepcopy(buffer),
        "non_tensor_bytes": buffer.read(),
        "step": torch.tensor(7, dtype=torch.float),
        "lr": 1.5,
        "nested": {"list": [1, 2, 3, 4]},
    }
    return state_dict, buffer


def _why_unpinnable(memory: dict[str, bool]) -> str | None:
    """Why this build cannot pin memory as ``memory`` asks, or None where it can."""
    if not memory.get("pin_memory"):
        return None
    if not torch.accelerator.is_available():
        return "pinned memory needs an accelerator; exercised where one is present"
    found = torch.accelerator.current_accelerator()
    if memory.get("share_memory") and found is not None and found.type != "cuda":
        return f"torch pins shared memory through CUDA's cudaHostRegister; this is {found}"
    return None


def _assert_lies_in_the_memory_asked(
    state: dict[str, Any], memory: dict[str, bool], who: str
) -> None:
    """Every tensor on the CPU; shared and pinned where ``memory`` asks and only there, but
    for a 0-dim tensor, which the utilities make a plain one."""
    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            continue
        where = f"{who}: {key}"
        assert value.device.type == "cpu", f"{where} lies on {value.device}"
        if not value.dim():
            continue
        shared, pinned = memory.get("share_memory", False), memory.get("pin_memory", False)
        assert value.is_shared() == shared, f"{where}: is_shared() is {value.is_shared()}"
        assert value.is_pinned() == pinned, f"{where}: is_pinned() is {value.is_pinned()}"


@pytest.mark.world(1)
@pytest.mark.parametrize(
    "memory",
    [
        {"share_memory": True},
        pytest.param({"pin_memory": True}, id="pinned"),
        pytest.param({"share_memory": True, "pin_memory": True}, id="pinned-shared"),
    ],
)
def test_create_cpu_state_dict(world, memory):
    reason = _why_unpinnable(memory)
    if reason:
        pytest.skip(reason)
    create = dict(both("_create_cpu_state_dict", ri.create_cpu_state_dict))
    similar = dict(both("_check_state_dict_similarity", ri.check_state_dict_similarity))
    copy_into = dict(both("_copy_state_dict", ri.copy_state_dict))
    for who in ("torch", "oracle"):
        state_dict, buffer = upstream_cpu_case(world.device)
        cpu_state_dict = create[who](state_dict, **memory)
        _assert_lies_in_the_memory_asked(cpu_state_dict, memory, who)
        assert similar[who](state_dict, cpu_state_dict), who
        tensor1 = cpu_state_dict["tensor1"]
        cpu_state_dict["tensor1"] = torch.arange(11)
        assert not similar[who](state_dict, cpu_state_dict), who
        cpu_state_dict["tensor1"] = tensor1
        copy_into[who](state_dict, cpu_state_dict)
        assert torch.equal(cpu_state_dict["tensor1"], torch.arange(10)), who
        assert torch.equal(cpu_state_dict["tensor2"], torch.ones(10)), who
        buffer.seek(0)
        cpu_state_dict["non_tensor_bytes_io"].seek(0)
        assert cpu_state_dict["non_tensor_bytes_io"].read() == buffer.read(), who
        buffer.seek(0)
        assert cpu_state_dict["non_tensor_bytes"] == buffer.read(), who
        assert cpu_state_dict["lr"] == 1.5, who
        assert cpu_state_dict["step"].item() == 7, who
        assert cpu_state_dict["nested"] == {"list": [1, 2, 3, 4]}, who
