"""Pipeline stages hold their own layers alone, under the whole model's names.

The ``pp`` cell (``conformance/cells/_pipeline.py``) splits the matrix's MLP into two stages:
``fc1`` and the scale after it, then ``fc2``. At 2 ranks each stage has one rank; at 4 ranks
each stage is on two data-parallel ranks. Every other check module judges it like any cell,
against the part of the single-process state its stage holds. Loads from rank 0 hand rank 0
the whole model's dicts, as a user loading a whole checkpoint into a pipeline does. Its
checkpoints carry the optimizer state flattened (``flatten_optimizer_state_dict``), the form
upstream gives for MPMD. They cross to and from other cells in that form, in
``test_resuming_commutes_with_training``:

- saved by two stages of two ranks, resumed by one process and by FSDP2 at 2 ranks;
- saved by FSDP2, resumed by two stages;
- saved at 4 ranks, resumed at 2.

Here, after two steps:

- each rank's model state dict (sharded and full) holds exactly its stage's keys, under their
  names in the whole model (never renumbered, never another stage's);
- its optimizer state holds the state of its stage's parameters alone;
- every stage's part together is the single-process state, bit for bit.

Also, the nested optimizer state (the default form) of a pipeline is saved through DCP and
resumed. Each stage saves its param groups under the same keys, with its own parameter names.
A correct build keeps every stage's, so the resumed stages train on as one process.

And stages built as upstream's pipeline test builds them (the whole model on meta, each rank
materializing its own part) save a checkpoint FSDP1 loads, each part as its stage saved it.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

from conformance._upstream import dcp, dsd, full_options
from conformance.cells import PARALLELISMS, first_size_and_four
from conformance.compare import (
    HELD,
    assert_state_dict_equal,
    every_rank,
    whole_model_state,
    whole_optimizer_state,
)
from conformance.models import fsdp1_small as small_fsdp1
from conformance.models.common import MLPWithBuffers, ground_truth, seeded_mlp, train
from conformance.models.optimizers import OPTIMIZERS
from conformance.training import (
    MORE_STEPS,
    assert_full_state_is_single_process,
    fresh_training,
    load_checkpoint,
    save_checkpoint,
    trained,
)

RECIPE = "adamw_step_lr"
SAVED_AFTER = 2
STAGED = pytest.mark.world(2, 4, applies=first_size_and_four("cell"))


def _stage_keys(stage: int) -> set[str]:
    """The keys of the whole model's state dict that stage ``stage`` of the MLP holds, by its
    plan (``MLPWithBuffers.stages``): written from the plan, not from what a rank holds."""
    held = MLPWithBuffers.stages[stage]
    return {
        key
        for key in seeded_mlp().state_dict()
        if any(key == name or key.startswith(f"{name}.") for name in held)
    }


@STAGED
@pytest.mark.parametrize("cell", ["pp"])
def test_each_stage_holds_its_own_layers_alone(world, cell):
    model, optimizer, _ = trained(PARALLELISMS[cell], world, RECIPE, SAVED_AFTER)
    stage = MLPWithBuffers.stages.index(getattr(model, HELD))
    expected = _stage_keys(stage)
    for options in (None, full_options()):
        held = set(dsd.get_model_state_dict(model, options=options))
        assert held == expected, f"rank {world.rank} (stage {stage}) holds {sorted(held)}"
    full_optimizer = dsd.get_optimizer_state_dict(model, optimizer, options=full_options())
    parameters = {key for key in expected if key != "running_scale"}
    assert set(full_optimizer["state"]) == parameters
    assert {n for g in full_optimizer["param_groups"] for n in g["params"]} == parameters
    truth = ground_truth(SAVED_AFTER, OPTIMIZERS[RECIPE], device=world.device)
    full_model = dsd.get_model_state_dict(model, options=full_options())
    assert_state_dict_equal(whole_model_state(full_model), truth.model)
    every_stage = whole_optimizer_state(full_optimizer)
    assert_state_dict_equal(every_stage["state"], truth.optimizer_state)


@STAGED
@pytest.mark.parametrize("cell", ["pp"])
def test_a_pipeline_checkpoint_of_nested_optimizer_state_resumes(world, cell):
    parallelism = PARALLELISMS[cell]
    model, optimizer, scheduler = trained(parallelism, world, RECIPE, SAVED_AFTER)
    path = str(world.tmp_path / "checkpoint")
    save_checkpoint(model, optimizer, path, scheduler=scheduler, flatten=False)
    training = fresh_training(parallelism, world, RECIPE)
    load_checkpoint(training[0], training[1], path, scheduler=training[2], flatten=False)
    # Before training on: a stage whose first step fails would leave the others waiting.
    lacking = every_rank(_groups_lacking_hyper_parameters(training[1]))
    assert not any(lacking), "; ".join(
        f"rank {rank}: {', '.join(found)}" for rank, found in enumerate(lacking) if found
    )
    train(training[0], training[1], MORE_STEPS, training[2], start=SAVED_AFTER)
    assert_full_state_is_single_process(
        training, SAVED_AFTER + MORE_STEPS, RECIPE, model_id=parallelism.model_id
    )


def _groups_lacking_hyper_parameters(optimizer: torch.optim.Optimizer) -> list[str]:
    """This rank's param groups that lack a hyper-parameter of the optimizer's defaults."""
    return [
        f"param group {index} has no {sorted(set(optimizer.defaults) - set(group))}"
        for index, group in enumerate(optimizer.param_groups)
        if set(optimizer.defaults) - set(group)
    ]


@pytest.mark.world(2)
def test_stages_built_on_meta_save_their_part_and_fsdp1_loads_it(world):
    """Upstream's pipeline flow: the whole model made on meta, each rank materializing its
    stage's part alone (``MLPWithBuffers.stages``, the seeded values) and stepping an Adam
    over that part; ``get_state_dict`` of the whole model, the other stage's entries still on
    meta, saved by ``dcp.save``. FSDP1 loads the checkpoint at the same size: every
    parameter, buffer and optimizer state comes back as the stage that held it saved it."""
    stage = MLPWithBuffers.stages[world.rank]
    model, optimizer = _a_stage_on_meta(stage, world.device)
    model_state, optim_state = dsd.get_state_dict(model, optimizer)
    path = str(world.tmp_path / "pipeline")
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=path)
    saved_model = {key: model_state[key].clone() for key in _stage_keys(world.rank)}
    saved_state = copy.deepcopy(optim_state["state"])
    loaded = small_fsdp1.fsdp1(seeded_mlp(), world.device)
    loaded_optimizer = OPTIMIZERS["adam"].build(loaded)[0]
    templates = dsd.get_state_dict(loaded, loaded_optimizer)
    dcp.load({"model": templates[0], "optim": templates[1]}, checkpoint_id=path)
    dsd.set_state_dict(
        loaded, loaded_optimizer, model_state_dict=templates[0], optim_state_dict=templates[1]
    )
    full_model = dsd.get_model_state_dict(loaded, options=full_options())
    full_optim = dsd.get_optimizer_state_dict(loaded, loaded_optimizer, options=full_options())
    assert_state_dict_equal({key: full_model[key] for key in saved_model}, saved_model)
    for key, state in saved_state.items():
        assert_state_dict_equal(full_optim["state"][key], state)


def _a_stage_on_meta(stage: tuple[str, ...], device: torch.device) -> tuple[nn.Module, Any]:
    """The MLP made on meta with ``stage``'s submodules and buffers materialized on
    ``device`` (the seeded values), and an Adam over their parameters, stepped once."""
    seeded = seeded_mlp().to(device)
    with torch.device("meta"):
        model = MLPWithBuffers()
    parameters = []
    for name in stage:
        if isinstance(getattr(model, name), nn.Module):
            part = getattr(model, name).to_empty(device=device)
            part.load_state_dict(getattr(seeded, name).state_dict())
            parameters += list(part.parameters())
        else:
            model.register_buffer(name, getattr(seeded, name).clone())
    optimizer = torch.optim.Adam(parameters, lr=0.01)
    for parameter in parameters:
        parameter.grad = torch.full_like(parameter, 0.5)
    optimizer.step()
    return model, optimizer
