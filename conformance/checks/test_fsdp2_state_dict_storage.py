"""FSDP2's ``model.state_dict()`` is a view of the sharded parameters, and its loads write
into them.

``fully_shard`` documents that its state dicts hold the sharded parameters as DTensors;
recipes call ``model.state_dict()`` once and keep it (upstream's ``test_cached_state_dict``),
so the view must stay a view through training. On every FSDP2 cell (data parallel, hybrid,
with tensor parallelism, and HSDP with tensor parallelism at 8 ranks):

- **a view**: each parameter's entry is a DTensor whose local tensor shares the parameter's
  local storage (a rank without a piece of an uneven parameter holds an empty one); reading
  the state dict leaves the parameters sharded, at their sizes; after three more training
  steps the kept state dict still shares that storage and holds the trained values;
- **loads write in place**: a state dict of DTensors of other storage (each local piece a
  clone, filled with a value of its own) loads into the parameters' values, and into their
  storage where the sharding is even;
- **a forward alone changes nothing**: after a forward with no backward (which leaves
  ``reshard_after_forward=False`` cells unsharded) the state dict and ``get_model_state_dict``
  equal what they were before it.

Two options no cell carries are judged on a model of their own, as upstream builds it:

- ``CPUOffloadPolicy``: a model built on the meta device, loaded piece by piece with
  ``assign=True, strict=False`` from CPU DTensors, computes and gives a state dict that lies on
  the CPU and holds what was loaded (pinned memory needs an accelerator and skips without
  one; loading device tensors into an offloaded model is refused on accelerators);
- ``shard_placement_fn`` sharding each parameter on its largest dim: the state dict holds
  ``Shard(largest dim)`` DTensors of the unsharded model's values, and a DCP checkpoint of
  it loads into the model sharded on dim 0 and back.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from conformance._upstream import dcp, dsd, dtensor, fsdp, fully_shard_on
from conformance.cells import PARALLELISMS, exists_at_size
from conformance.compare import assert_trees_identical, local_part
from conformance.models.common import batch, computed_on, train
from conformance.training import trained

CELLS = [name for name, cell in PARALLELISMS.items() if cell.fsdp2 and not cell.partial]
RECIPE = "adam"
LATER_STEPS = 3


def _trained(world, cell: str) -> tuple[nn.Module, torch.optim.Optimizer]:
    parallelism = PARALLELISMS[cell]
    parallelism.skip_unless_runnable(world.device)
    model, optimizer, _ = trained(parallelism, world, RECIPE, 1)
    return model, optimizer


def _storage(tensor: torch.Tensor) -> int:
    return int(local_part(tensor).untyped_storage().data_ptr())


def _assert_views(world, model: nn.Module, state: dict, when: str) -> None:
    for name, parameter in model.named_parameters():
        entry = state[name]
        where = f"rank {world.rank}, {name} {when}"
        assert isinstance(entry, dtensor.DTensor), f"{where}: a {type(entry).__name__}"
        piece, held = local_part(entry), local_part(parameter)
        if held.numel() == 0:
            assert piece.numel() == 0, (
                f"{where}: {piece.numel()} elements where the rank holds none"
            )
            continue
        assert _storage(entry) == _storage(parameter), (
            f"{where}: the state dict's piece does not share the parameter's storage"
        )
        assert torch.equal(piece, held), f"{where}: {piece.tolist()} against {held.tolist()}"


@pytest.mark.world(2, 4, 8, applies=exists_at_size("cell"))
@pytest.mark.parametrize("cell", CELLS)
def test_the_state_dict_is_a_view_of_the_sharded_parameters(world, cell):
    model, optimizer = _trained(world, cell)
    pieces = {name: local_part(p).shape for name, p in model.named_parameters()}
    state = model.state_dict()
    for name, parameter in model.named_parameters():
        where = f"rank {world.rank}, {name}: reading the state dict left it"
        assert isinstance(parameter, dtensor.DTensor), f"{where} a {type(parameter).__name__}"
        held = local_part(parameter).shape
        assert held == pieces[name], f"{where} holding {tuple(held)}, not {tuple(pieces[name])}"
    _assert_views(world, model, state, "after one step")
    before = {name: local_part(value).clone() for name, value in state.items()}
    train(model, optimizer, LATER_STEPS, start=1)
    _assert_views(world, model, state, f"kept through {LATER_STEPS} more steps")
    unchanged = [
        name
        for name, _ in model.named_parameters()
        if before[name].numel() and torch.equal(local_part(state[name]), before[name])
    ]
    assert not unchanged, f"rank {world.rank}: the kept state dict did not train on: {unchanged}"


@pytest.mark.world(2, 4, 8, applies=exists_at_size("cell"))
@pytest.mark.parametrize("cell", CELLS)
def test_moving_the_model_away_and_back_ends_the_view(world, cell):
    if world.device.type == "cpu":
        pytest.skip("moving to the CPU and back needs an accelerator; this world computes on it")
    model, _ = _trained(world, cell)
    state = model.state_dict()
    model.cpu()
    model.to(world.device)
    for name, parameter in model.named_parameters():
        if local_part(parameter).numel():
            assert _storage(state[name]) != _storage(parameter), (
                f"rank {world.rank}, {name}: the state dict read before the move still shares "
                "the moved parameter's storage"
            )


@pytest.mark.world(2, 4, 8, applies=exists_at_size("cell"))
@pytest.mark.parametrize("cell", CELLS)
def test_a_state_dict_of_other_storage_loads_into_the_parameters(world, cell):
    model, _ = _trained(world, cell)
    _assert_loads_in_place(world, model)


def _evenly_sharded(parameter: nn.Parameter) -> bool:
    """Every rank holds an equal piece: no padding that a load may re-pad elsewhere."""
    mesh = parameter.device_mesh
    pieces = math.prod(
        mesh.size(dim) for dim, placement in enumerate(parameter.placements) if placement.is_shard()
    )
    return local_part(parameter).numel() * pieces == parameter.numel()


def _assert_loads_in_place(world, model: nn.Module) -> None:
    """Clones of the state dict's pieces, each filled with a value of its own, load into the
    parameters' values, and into their storage where the sharding is even."""
    before = {name: _storage(parameter) for name, parameter in model.named_parameters()}
    fills = {}
    loaded = {}
    for index, (name, value) in enumerate(model.state_dict().items()):
        fills[name] = 40.0 + index
        loaded[name] = value.detach().clone().fill_(fills[name])
    model.load_state_dict(loaded)
    for name, parameter in model.named_parameters():
        held = local_part(parameter)
        where = f"rank {world.rank}, {name}"
        assert torch.equal(held, torch.full_like(held, fills[name])), (
            f"{where}: holds {held.tolist()} after loading {fills[name]}"
        )
        if _evenly_sharded(parameter) and held.numel():
            assert _storage(parameter) == before[name], f"{where}: the load replaced its storage"


@pytest.mark.world(2, 4, 8, applies=exists_at_size("cell"))
@pytest.mark.parametrize("cell", CELLS)
def test_a_forward_alone_leaves_the_state_dict_as_it_was(world, cell):
    model, _ = _trained(world, cell)
    state = {name: _copied(value) for name, value in model.state_dict().items()}
    got = _copied(dsd.get_model_state_dict(model))
    with torch.no_grad():
        model(batch(1).to(computed_on(model)))
    assert_trees_identical(
        {name: _copied(value) for name, value in model.state_dict().items()},
        state,
        f"rank {world.rank}: model.state_dict() after a forward",
    )
    assert_trees_identical(
        _copied(dsd.get_model_state_dict(model)),
        got,
        f"rank {world.rank}: get_model_state_dict after a forward",
    )


def _copied(value):
    """A DTensor's local piece and placements, or a tensor, copied: what was read then."""
    if isinstance(value, dict):
        return {key: _copied(item) for key, item in value.items()}
    if isinstance(value, dtensor.DTensor):
        return (local_part(value).clone(), tuple(value.placements), tuple(value.size()))
    return value.clone() if isinstance(value, torch.Tensor) else value


def _two_layers(width: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(width, width // 2), nn.Linear(width // 2, width))


OFFLOAD_WIDTH = 8


@pytest.mark.world(2, 4)
@pytest.mark.parametrize("pinned", [False, True], ids=["unpinned", "pinned"])
def test_a_cpu_offloaded_model_loads_piece_by_piece_and_its_state_dict_lies_on_the_cpu(
    world, pinned
):
    if pinned and world.device.type == "cpu":
        pytest.skip("pinned host memory needs an accelerator; this world computes on the CPU")
    shard = fully_shard_on(world.device)
    policy = fsdp.CPUOffloadPolicy(pin_memory=pinned)
    mesh = world.mesh(world.size)
    with torch.device("meta"):
        model = _two_layers(OFFLOAD_WIDTH)
    for layer in model:
        shard(layer, mesh=mesh, offload_policy=policy)
    shard(model, mesh=mesh, offload_policy=policy)
    generator = torch.Generator().manual_seed(0)
    whole = {
        name: torch.randn(p.size(), generator=generator) for name, p in model.named_parameters()
    }
    for name, parameter in list(model.named_parameters()):
        piece = dtensor.distribute_tensor(
            whole[name].to(world.device), parameter.device_mesh, parameter.placements
        ).cpu()
        model.load_state_dict({name: piece}, assign=True, strict=False)
    model(torch.rand(OFFLOAD_WIDTH, OFFLOAD_WIDTH, device=world.device)).sum().backward()
    for name, value in model.state_dict().items():
        piece = local_part(value)
        assert piece.device.type == "cpu", (
            f"rank {world.rank}, {name}: the offloaded state lies on {piece.device}"
        )
        expected = local_part(
            dtensor.distribute_tensor(
                whole[name].to(world.device), value.device_mesh, value.placements
            )
        ).cpu()
        assert torch.equal(piece, expected), (
            f"rank {world.rank}, {name}: holds {piece.tolist()}, loaded {expected.tolist()}"
        )


@pytest.mark.world(2, 4)
def test_an_offloaded_model_refuses_parameters_loaded_on_the_accelerator(world):
    if world.device.type == "cpu":
        pytest.skip("on a CPU world every parameter lies on the CPU: nothing to refuse")
    shard = fully_shard_on(world.device)
    with torch.device("meta"):
        model = _two_layers(OFFLOAD_WIDTH)
    for layer in model:
        shard(layer, offload_policy=fsdp.CPUOffloadPolicy(pin_memory=False))
    shard(model, offload_policy=fsdp.CPUOffloadPolicy(pin_memory=False))
    for name, parameter in list(model.named_parameters()):
        piece = dtensor.distribute_tensor(
            torch.randn(parameter.size(), device=world.device),
            parameter.device_mesh,
            parameter.placements,
        )
        model.load_state_dict({name: piece}, assign=True, strict=False)
    with pytest.raises(RuntimeError, match=r"non-CPU device: \[\('0\.weight'"):
        model(torch.rand(OFFLOAD_WIDTH, OFFLOAD_WIDTH, device=world.device))


PLACED_WIDTH = 16
MESHES = {"dp": lambda world: world.mesh(world.size), "hybrid": lambda world: _hybrid(world)}


def _hybrid(world):
    if world.size < 4:
        pytest.skip("a hybrid mesh of replicas of two-rank shards needs 4 ranks")
    return world.mesh((world.size // 2, 2), ("replicate", "shard"))


def _largest_dim(parameter: nn.Parameter):
    return dtensor.Shard(max(range(parameter.dim()), key=lambda dim: parameter.size(dim)))


def _placed(world, mesh, by_largest_dim: bool) -> nn.Module:
    torch.manual_seed(0)
    model = _two_layers(PLACED_WIDTH).to(world.device)
    shard = fully_shard_on(world.device)
    placement = _largest_dim if by_largest_dim else None
    for layer in model:
        shard(layer, mesh=mesh, shard_placement_fn=placement)
    shard(model, mesh=mesh, shard_placement_fn=placement)
    return model


@pytest.mark.world(2, 4)
@pytest.mark.parametrize("mesh_kind", sorted(MESHES))
def test_parameters_sharded_on_their_largest_dim_save_their_values_and_reshard(world, mesh_kind):
    mesh = MESHES[mesh_kind](world)
    torch.manual_seed(0)
    whole = _two_layers(PLACED_WIDTH).state_dict()
    model = _placed(world, mesh, by_largest_dim=True)
    state = model.state_dict()
    for name, value in state.items():
        largest = max(range(value.dim()), key=lambda dim: value.size(dim))
        assert value.placements[-1] == dtensor.Shard(largest), (
            f"rank {world.rank}, {name}: placed {value.placements}, not on dim {largest}"
        )
        assert torch.equal(value.full_tensor().cpu(), whole[name]), (
            f"rank {world.rank}, {name}: other values than the unsharded model's"
        )
    _assert_views(world, model, state, "sharded on its largest dim")
    checkpoint = str(world.tmp_path / "largest-dim")
    dcp.save(state, checkpoint_id=checkpoint)
    on_dim_0 = _placed(world, mesh, by_largest_dim=False)
    with torch.no_grad():
        for parameter in on_dim_0.parameters():
            parameter.zero_()
    target = on_dim_0.state_dict()
    dcp.load(target, checkpoint_id=checkpoint)
    on_dim_0.load_state_dict(target)
    for name, value in on_dim_0.state_dict().items():
        assert torch.equal(value.full_tensor().cpu(), whole[name]), (
            f"rank {world.rank}, {name}: loaded sharded on dim 0, holds other values"
        )
    _assert_loads_in_place(world, model)
