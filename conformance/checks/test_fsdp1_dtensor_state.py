"""FSDP1 given a device mesh: sharded state dicts of DTensors, the same shards its process
groups give as ShardedTensors, and loads of them back after ``torch.save``.

The cells given a device mesh that name a wrapping over process groups instead
(``on_process_groups``: FULL_SHARD on a 1-D mesh, HYBRID_SHARD on its 2-D one) run at 4 ranks,
where some tensors' last shards are empty. After two Adam steps, on device and offloaded:

- The SHARDED model state and ``FSDP.optim_state_dict`` of the mesh cell and of its twin over
  process groups have the same keys in the same order. Each DTensor is sharded on dim 0 over
  the mesh's last dim and replicated over the others. Its local tensor is the ShardedTensor's
  local shard (empty where that rank holds none), bit for bit and on the same device. The
  ``step`` counts are equal.
- Both sides' sharded optimizer state, offloaded too, equals the oracle's.
- A sharded model or optimizer state dict, saved by ``torch.save`` and trained past, loads
  back by ``torch.load`` and ``load_state_dict`` (the optimizer's through
  ``FSDP.optim_state_dict_to_load``): the state dicts then taken equal the saved ones.
- LOCAL_STATE_DICT is refused on every FSDP1 cell given a mesh, for the model and for
  ``FSDP.optim_state_dict``, by an error naming the type.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

import reference_impl as ri
from conformance._upstream import dtensor, fsdp, quiet_deprecations, sharded_tensor
from conformance.cells import PARALLELISMS, exists_at_size
from conformance.compare import assert_trees_identical
from conformance.models.common import seeded_mlp, train
from conformance.models.optimizers import adam
from conformance.training import through_torch_save

TWINNED = [name for name, cell in PARALLELISMS.items() if cell.on_process_groups is not None]
ON_A_MESH = [name for name, cell in PARALLELISMS.items() if cell.fsdp1 and cell.fsdp1_mesh]
OFFLOAD = pytest.mark.parametrize("offload", [False, True], ids=["on_device", "offloaded"])


def _trained(world: Any, name: str, on_process_groups: bool = False) -> tuple[Any, Any]:
    """The cell's model (or its twin over process groups) and Adam, after two steps."""
    cell = PARALLELISMS[name]
    cell.require(world.size)
    wrap = cell.on_process_groups if on_process_groups else cell.wrap
    assert wrap is not None
    model = wrap(seeded_mlp().to(world.device), world)
    optimizer = adam(model)
    train(model, optimizer, 2)
    return model, optimizer


def _sharded(model: Any, offload: bool) -> Any:
    """``FSDP.state_dict_type`` as SHARDED, model and optimizer configs offloading or not."""
    return fsdp.FullyShardedDataParallel.state_dict_type(
        model,
        fsdp.StateDictType.SHARDED_STATE_DICT,
        fsdp.ShardedStateDictConfig(offload_to_cpu=offload),
        fsdp.ShardedOptimStateDictConfig(offload_to_cpu=offload),
    )


def _state_dicts(model: Any, optimizer: Any, offload: bool) -> tuple[Any, Any]:
    """The SHARDED model state dict and ``FSDP.optim_state_dict``."""
    with quiet_deprecations(), _sharded(model, offload):
        return model.state_dict(), fsdp.FullyShardedDataParallel.optim_state_dict(model, optimizer)


def _assert_same_shard(where: str, on_mesh: Any, on_groups: Any, offload: bool) -> None:
    """``on_mesh`` is the DTensor of the ShardedTensor ``on_groups``: sharded on dim 0 over the
    mesh's last dim and replicated over the others, of the same global shape, its local
    tensor the local shard (empty where there is none) on the same device. Plain tensors (the
    buffers, which FSDP1 does not shard) must be identical."""
    if isinstance(on_groups, torch.Tensor) and not isinstance(on_mesh, dtensor.DTensor):
        assert_trees_identical(on_mesh, on_groups, where)
        return
    if not isinstance(on_mesh, dtensor.DTensor) or not isinstance(
        on_groups, sharded_tensor.ShardedTensor
    ):
        raise AssertionError(
            f"{where}: a DTensor on the mesh and a ShardedTensor over process groups expected, "
            f"got {type(on_mesh).__name__} and {type(on_groups).__name__}"
        )
    mesh = on_mesh.device_mesh
    placements = (dtensor.Replicate(),) * (mesh.ndim - 1) + (dtensor.Shard(0),)
    if tuple(on_mesh.placements) != placements or on_mesh.shape != on_groups.size():
        raise AssertionError(
            f"{where}: DTensor {on_mesh.placements} of shape {tuple(on_mesh.shape)}, expected "
            f"{placements} of the ShardedTensor's shape {tuple(on_groups.size())}"
        )
    local = on_mesh.to_local()
    if not on_groups.local_shards():
        if local.numel() != 0:
            raise AssertionError(f"{where}: no ShardedTensor shard here, a DTensor of {local}")
        return
    shard = on_groups.local_tensor()
    assert_trees_identical(local, shard, where)
    if offload and local.device.type != "cpu":
        raise AssertionError(f"{where}: offloaded, yet on {local.device}")


def _assert_same_keys(where: str, on_mesh: dict[str, Any], on_groups: dict[str, Any]) -> None:
    if list(on_mesh) != list(on_groups):
        raise AssertionError(f"{where}: keys {list(on_mesh)} on the mesh, {list(on_groups)} else")


@pytest.mark.world(4, applies=exists_at_size())
@OFFLOAD
@pytest.mark.parametrize("name", TWINNED)
def test_a_device_mesh_gives_the_shards_its_process_groups_give(world, name, offload):
    model, optimizer = _trained(world, name)
    twin, twin_optimizer = _trained(world, name, on_process_groups=True)
    model_state, optim_state = _state_dicts(model, optimizer, offload)
    twin_model_state, twin_optim_state = _state_dicts(twin, twin_optimizer, offload)
    rank = f"rank {world.rank}"
    _assert_same_keys(f"{rank} model", model_state, twin_model_state)
    for key, value in model_state.items():
        _assert_same_shard(f"{rank} model {key}", value, twin_model_state[key], offload)
    _assert_same_keys(f"{rank} optimizer", optim_state["state"], twin_optim_state["state"])
    for key, state in optim_state["state"].items():
        _assert_same_keys(f"{rank} optimizer {key}", state, twin_optim_state["state"][key])
        for state_name, value in state.items():
            where = f"{rank} optimizer {key}.{state_name}"
            _assert_same_shard(where, value, twin_optim_state["state"][key][state_name], offload)


@pytest.mark.world(4, applies=exists_at_size())
@OFFLOAD
@pytest.mark.parametrize("side", ["mesh", "process_groups"])
@pytest.mark.parametrize("name", TWINNED)
def test_sharded_optimizer_state_matches_the_oracle(world, name, side, offload):
    """``FSDP.optim_state_dict`` under ``ShardedOptimStateDictConfig(offload_to_cpu=...)``."""
    model, optimizer = _trained(world, name, on_process_groups=side == "process_groups")
    _, theirs = _state_dicts(model, optimizer, offload)
    ours = ri.fsdp_optim_state_dict(model, optimizer, shard_state=True, cpu_offload=offload)
    assert_trees_identical(theirs, ours)


@pytest.mark.world(4, applies=exists_at_size())
@OFFLOAD
@pytest.mark.parametrize("name", TWINNED)
def test_a_sharded_state_dict_loads_back_from_torch_save(world, name, offload):
    model, optimizer = _trained(world, name)
    with quiet_deprecations(), _sharded(model, offload):
        saved = through_torch_save(model.state_dict())
        expected = copy.deepcopy(model.state_dict())
        train(model, optimizer, 1)
        model.load_state_dict(saved)
        assert_trees_identical(model.state_dict(), expected)


@pytest.mark.world(4, applies=exists_at_size())
@OFFLOAD
@pytest.mark.parametrize("name", TWINNED)
def test_a_sharded_optimizer_state_dict_loads_back_from_torch_save(world, name, offload):
    model, optimizer = _trained(world, name)
    api = fsdp.FullyShardedDataParallel
    with quiet_deprecations(), _sharded(model, offload):
        saved = through_torch_save(api.optim_state_dict(model, optimizer))
        expected = copy.deepcopy(api.optim_state_dict(model, optimizer))
        train(model, optimizer, 1)
        optimizer.load_state_dict(api.optim_state_dict_to_load(model, optimizer, saved))
        assert_trees_identical(api.optim_state_dict(model, optimizer), expected)


@pytest.mark.world(4, applies=exists_at_size())
@pytest.mark.parametrize("name", ON_A_MESH)
def test_local_state_dicts_are_refused_on_a_device_mesh(world, name):
    cell = PARALLELISMS[name]
    cell.require(world.size)
    model = cell.parallelise(seeded_mlp(), world)
    optimizer = adam(model)
    train(model, optimizer, 1)
    api = fsdp.FullyShardedDataParallel
    with quiet_deprecations(), api.state_dict_type(model, fsdp.StateDictType.LOCAL_STATE_DICT):
        with pytest.raises(RuntimeError, match="LOCAL_STATE_DICT"):
            model.state_dict()
        with pytest.raises(RuntimeError, match="LOCAL_STATE_DICT"):
            api.optim_state_dict(model, optimizer)
