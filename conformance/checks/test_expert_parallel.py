"""Expert parallelism: each rank holds its experts alone, sharded over the ranks that share them.

The ``ep`` cell (``conformance/cells/_experts.py``) trains a mixture of two experts between the
MLP's layers (``conformance/models/experts.py``). At 2 ranks each rank holds one expert. At 4
ranks the cell uses a ``(dp, ep)`` mesh of 2 by 2. Each expert is held by the two ranks of its
``dp`` group and sharded by FSDP2 over them; the rest of the model is sharded over all four.
Upstream's ``e2e/test_fsdp_ep.py`` and torchtitan's MoE training lay it out this way. Training
is the single process's bit for bit: the expert boundaries sum two terms, in the order one
process does.

Every other check module judges the cell like any other, against the part of the
single-process state a rank holds. Its checkpoints carry flattened optimizer state, as a
pipeline's stages do. Its checkpoints are resumed by ``test_resuming_commutes_with_training``
in one process, in FSDP2 at 2 ranks, and at 2 ranks of the cell. That module also resumes
FSDP2's checkpoints in the cell.

Here, what upstream's test asks of the layout, after two steps:

- each rank's sharded state dicts hold every shared key and its own expert's keys, and no
  other expert's;
- every parameter and its optimizer state is a DTensor on the mesh of the ranks that hold it
  (its expert's ranks, or the whole world);
- the optimizer state is keyed by exactly the rank's parameters;
- every rank's full state together is the single-process state, bit for bit.

The same layout under FSDP1 (given device meshes, each rank's expert over its ranks' mesh)
is judged on its sharded state dicts, before any step, as upstream's test judges it.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from conformance._upstream import device_mesh, dsd, dtensor, full_options
from conformance.cells import PARALLELISMS, first_size_and_four
from conformance.compare import assert_state_dict_equal, whole_model_state, whole_optimizer_state
from conformance.models import fsdp1_small as small_fsdp1
from conformance.models.experts import EXPERTS, seeded_mixture
from conformance.models.optimizers import OPTIMIZERS
from conformance.models.zoo import truth_of
from conformance.training import trained

RECIPE = "adam"
SAVED_AFTER = 2


def _expert_of(rank: int) -> int:
    """The expert a rank holds, by the cell's layout: ``ep`` is the mesh's inner dimension."""
    return rank % EXPERTS


def _owners(key: str, size: int) -> list[int]:
    """The ranks that hold ``key``: its expert's, or every rank."""
    if not key.startswith("experts."):
        return list(range(size))
    expert = int(key.split(".")[1])
    return [rank for rank in range(size) if _expert_of(rank) == expert]


def _assert_on_its_owners(path: str, value: Any, size: int) -> None:
    assert isinstance(value, dtensor.DTensor), f"{path}: {type(value).__name__}, not a DTensor"
    ranks = sorted(value.device_mesh.mesh.flatten().tolist())
    assert ranks == _owners(path.split(":")[0], size), f"{path}: on the mesh of ranks {ranks}"


@pytest.mark.world(2, 4, applies=first_size_and_four("cell"))
@pytest.mark.parametrize("cell", ["ep"])
def test_each_rank_holds_its_experts_alone(world, cell):
    parallelism = PARALLELISMS[cell]
    model, optimizer, _ = trained(parallelism, world, RECIPE, SAVED_AFTER)
    truth = truth_of(parallelism, SAVED_AFTER, OPTIMIZERS[RECIPE], world.device)
    mine = f"experts.{_expert_of(world.rank)}."
    expected = {k for k in truth.model if not k.startswith("experts.") or k.startswith(mine)}
    model_state = dsd.get_model_state_dict(model)
    assert set(model_state) == expected, f"rank {world.rank} holds {sorted(model_state)}"
    parameters = {name for name, _ in model.named_parameters()}
    for key in sorted(parameters):
        _assert_on_its_owners(key, model_state[key], world.size)
    optimizer_state = dsd.get_optimizer_state_dict(model, optimizer)
    assert set(optimizer_state["state"]) == parameters
    for key in sorted(parameters):
        for entry in ("exp_avg", "exp_avg_sq"):
            _assert_on_its_owners(
                f"{key}:{entry}", optimizer_state["state"][key][entry], world.size
            )
    full_model = dsd.get_model_state_dict(model, options=full_options())
    assert_state_dict_equal(whole_model_state(full_model), truth.model)
    full_optimizer = dsd.get_optimizer_state_dict(model, optimizer, options=full_options())
    assert_state_dict_equal(whole_optimizer_state(full_optimizer)["state"], truth.optimizer_state)


@pytest.mark.world(4)
def test_fsdp1_shards_each_expert_over_its_ranks_and_the_rest_over_all(world):
    """The layout of upstream's test under FSDP1 (``use_orig_params``, given device meshes):
    each rank's expert wrapped over a 1-D mesh of the ranks that hold it (made from their
    group), the model over the whole world, before any step. ``get_state_dict`` holds every
    shared key and the rank's own expert's; each parameter and its Adam moments are DTensors
    on the mesh of the ranks that hold it; the optimizer state is keyed by those parameters."""
    groups = [dist.new_group(_owners(f"experts.{index}.", world.size)) for index in range(EXPERTS)]
    mine = _expert_of(world.rank)
    expert_mesh = device_mesh.DeviceMesh.from_group(
        groups[mine], world.device_type, mesh_dim_names=("dp",)
    )
    model = seeded_mixture().to(world.device)
    parameters = {
        name
        for name, _ in model.named_parameters()
        if not name.startswith("experts.") or name.startswith(f"experts.{mine}.")
    }
    expected = {key for key in model.state_dict() if key in parameters or "experts." not in key}
    for index in range(EXPERTS):
        if index == mine:
            model.experts[index] = small_fsdp1.fsdp1(
                model.experts[index], world.device, use_orig_params=True, device_mesh=expert_mesh
            )
        else:
            model.experts._modules[str(index)] = None
    world_mesh = world.mesh(world.size, ("world",))
    model = small_fsdp1.fsdp1(model, world.device, use_orig_params=True, device_mesh=world_mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model_state, optimizer_state = dsd.get_state_dict(model, optimizer)
    assert set(model_state) == expected, f"rank {world.rank} holds {sorted(model_state)}"
    assert set(optimizer_state["state"]) == parameters, sorted(optimizer_state["state"])
    for key in sorted(parameters):
        _assert_on_its_owners(key, model_state[key], world.size)
        for entry in ("exp_avg", "exp_avg_sq"):
            value = optimizer_state["state"][key][entry]
            _assert_on_its_owners(f"{key}:{entry}", value, world.size)
