"""Conversions between DCP checkpoints and ``torch.save`` files (``format_utils``).

- ``dcp_to_torch_save``: a cell saves a checkpoint after ``SAVED_AFTER`` steps (model and
  optimizer, as a training loop saves them). Converted on rank 0 alone, it is one
  ``torch.save`` file. That file's model state, optimizer state and hyper-parameters are the
  single-process run's at that step.
- ``torch_save_to_dcp``: ``torch.save`` writes the single-process run's full state after
  ``SAVED_AFTER`` steps, and rank 0 converts it. It loads into every cell's fresh objects,
  which then train on to exactly what ``SAVED_AFTER + MORE_STEPS`` single-process steps give.
- ``BroadcastingTorchSaveReader`` with ``DynamicMetaLoadPlanner``: a model's ``torch.save``
  file is present on rank 0 only. It is read there and broadcast through ``dcp.load`` into
  every cell's full model state dict. The reader takes tensors only, so this is the model's
  state alone. Then ``set_model_state_dict`` loads it, and the model holds the single-process
  values. Into a sharded state dict (DTensors, ShardedTensors) the reader hangs on 2.13.0:
  rank 0 broadcasts each whole tensor, while the other ranks receive into their pieces.

Every cell runs at every size it has. A full optimizer state read back from a checkpoint may
hold Adam's ``betas`` as a list where the run holds a tuple. DCP stores a param group's values
as it was given them, and rebuilds sequences as lists. So hyper-parameters are compared as
values. The mutant ``dcp_to_torch_save_drops_non_tensor_state`` is a conversion that keeps the
tensors and drops the rest (step counts of plain numbers, hyper-parameters). Only this module
sees it.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from conformance._upstream import dcp, dcp_formats, dsd, full_options
from conformance.cells import (
    PARALLELISMS,
    Parallelism,
    comparison_tolerance,
    exists_at_size,
    flattened_between,
)
from conformance.compare import assert_state_dict_equal, held_part
from conformance.models.optimizers import OPTIMIZERS
from conformance.models.zoo import truth_of
from conformance.training import (
    MORE_STEPS,
    assert_full_state_is_single_process,
    assert_state_is_single_process,
    fresh_training,
    resume,
    save_checkpoint,
    trained,
)

RECIPE = "adam"
SAVED_AFTER = 2
CELLS = sorted(PARALLELISMS)


def _single_process_state(
    cell: Parallelism, device: torch.device, flattened: bool | None = None
) -> dict[str, Any]:
    """What a single-process training loop of ``cell``'s model on ``device`` would
    ``torch.save`` after ``SAVED_AFTER`` steps: its model state and its optimizer state keyed
    by parameter names, nested or (``flattened``, for a model's parts to read) flattened."""
    truth = truth_of(cell, SAVED_AFTER, OPTIMIZERS[RECIPE], device)
    optim = truth.flattened_optimizer_state_dict if flattened else truth.optimizer_state_dict
    return {"model": truth.model, "optim": optim}


@pytest.mark.world(1, 2, 4, applies=exists_at_size("cell"))
@pytest.mark.parametrize("cell", CELLS)
def test_dcp_to_torch_save_gives_the_full_training_state(world, cell):
    parallelism = PARALLELISMS[cell]
    parallelism.skip_unless_runnable(world.device)
    model, optimizer, _ = trained(parallelism, world, RECIPE, SAVED_AFTER)
    checkpoint = world.tmp_path / "checkpoint"
    save_checkpoint(model, optimizer, str(checkpoint))
    world.barrier()
    if world.rank == 0:
        converted = world.tmp_path / "converted.pt"
        dcp_formats.dcp_to_torch_save(checkpoint, converted)
        state = torch.load(converted, weights_only=True)  # torch.load's default since 2.6
        assert_state_is_single_process(
            state["model"],
            state["optim"],
            SAVED_AFTER,
            RECIPE,
            device=world.device,
            model_id=parallelism.model_id,
            full_load=True,
            **comparison_tolerance(parallelism),
        )
    world.barrier()


def _single_process_checkpoint(world: Any, state: dict[str, Any]) -> str:
    """``state`` written by ``torch.save`` and converted to DCP on rank 0; its directory."""
    checkpoint = world.tmp_path / "from_torch_save"
    if world.rank == 0:
        torch.save(state, world.tmp_path / "single.pt")
        dcp_formats.torch_save_to_dcp(world.tmp_path / "single.pt", checkpoint)
    world.barrier()
    return str(checkpoint)


@pytest.mark.world(1, 2, 4, applies=exists_at_size("cell"))
@pytest.mark.parametrize("cell", CELLS)
def test_torch_save_to_dcp_resumes_every_cell_as_one_process(world, cell):
    parallelism = PARALLELISMS[cell]
    parallelism.skip_unless_runnable(world.device)
    flatten = flattened_between(cell)
    path = _single_process_checkpoint(
        world, _single_process_state(parallelism, world.device, flatten)
    )
    training = fresh_training(parallelism, world, RECIPE)
    resume(training, path, SAVED_AFTER, flatten=flatten)
    assert_full_state_is_single_process(
        training,
        SAVED_AFTER + MORE_STEPS,
        RECIPE,
        model_id=parallelism.model_id,
        full_load=True,
        **comparison_tolerance(parallelism),
    )


@pytest.mark.world(1, 2, 4, applies=exists_at_size("cell"))
@pytest.mark.parametrize("cell", CELLS)
def test_a_torch_save_file_on_rank_0_broadcasts_into_every_cell(world, cell):
    parallelism = PARALLELISMS[cell]
    parallelism.skip_unless_runnable(world.device)
    expected = _single_process_state(parallelism, world.device)["model"]
    path = world.tmp_path / "model.pt"
    if world.rank == 0:
        torch.save(expected, path)
    world.barrier()
    model, _, _ = fresh_training(parallelism, world, RECIPE)
    state = dsd.get_model_state_dict(model, options=full_options())
    dcp.load(
        state,
        storage_reader=dcp_formats.BroadcastingTorchSaveReader(),
        planner=dcp_formats.DynamicMetaLoadPlanner(),
        checkpoint_id=str(path),
    )
    dsd.set_model_state_dict(model, state, options=full_options())
    loaded = dsd.get_model_state_dict(model, options=full_options())
    assert_state_dict_equal(loaded, held_part(expected, model), **comparison_tolerance(parallelism))
