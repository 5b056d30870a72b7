"""Save, load, train commutes with train: resuming from a checkpoint changes nothing.

Judged against training that never stopped, not against the oracle. A checkpoint is taken
through DCP after ``k`` steps: the model, the optimizer and the scheduler, as a training loop
keeps them. It is loaded into fresh objects, which train ``n`` more steps. They must give what
``k + n`` steps give without the round trip:

- In the same cell at the same world size, bit for bit, after every one of the ``n`` steps.
  The comparison covers each parameter's local values and gradient, the buffers, the
  optimizer's state and hyper-parameters, and the scheduler's state. Every cell runs at its
  smallest world size above one and at 4. The optimizers are Adam, AdamW, SGD with momentum
  and AdamW under a StepLR scheduler. The saves come before the first step (an optimizer with
  no state yet) and after two steps. Also saved after two steps: a model with a frozen layer
  (no gradient, no optimizer state), and Adam's per-layer groups around an empty group.
- Saved at 4 ranks by one cell and loaded by another at 4, 2 or 1 ranks (rank 0 alone). The
  full model, optimizer state and hyper-parameters after the ``n`` steps equal the
  single-process run's after ``k + n``. Where a cell is tensor-parallel, they compare within
  the tensor-parallel tolerances.

A failure names the first step at which the trajectories part, the key and both values.
"""

from __future__ import annotations

from typing import Any

import pytest

from conformance.cells import (
    DEFAULT_MODEL,
    PARALLELISMS,
    Parallelism,
    first_size_and_four,
    flattened_between,
    reshards,
)
from conformance.models.optimizers import OPTIMIZERS
from conformance.models.zoo import MODELS
from conformance.training import (
    MORE_STEPS,
    first_parting,
    fresh_training,
    model_between,
    plain_trajectory,
    resume,
    resume_on_the_first_ranks,
    save_checkpoint,
    train_observed,
    unobserved,
)

SAVED_AT = {"before_first_step": 0, "after_2_steps": 2}  # by test id: the steps before saving
RECIPES = ("adam", "adamw", "sgd_momentum", "adamw_step_lr")
LABELS = ("resumed", "never stopped")


def _skip_unless_applies(cell: Parallelism, recipe: str, model_id: str) -> None:
    OPTIMIZERS[recipe].skip_unless_applies(cell)
    reason = MODELS[model_id].unsupported(cell)
    if reason is not None:
        pytest.skip(reason)


def _checkpoint_after(
    steps: int,
    cell: Parallelism,
    world: Any,
    recipe: str,
    model_id: str,
    flatten: bool | None = None,
) -> str:
    """Where fresh training of the zoo's ``model_id`` in ``cell`` saved its checkpoint after
    ``steps`` steps (``flatten``: the optimizer state's form, see
    ``conformance._dcp.training_state``)."""
    model, optimizer, scheduler = fresh_training(cell, world, recipe, model_id)
    train_observed(model, optimizer, scheduler, steps, unobserved, MODELS[model_id].inputs)
    path = str(world.tmp_path / "checkpoint")
    save_checkpoint(model, optimizer, path, scheduler=scheduler, flatten=flatten)
    return path


def _assert_resumes_as_never_stopped(
    world: Any, cell_name: str, recipe: str, saved: str, model_id: str | None = None
) -> None:
    """Training resumed after ``saved`` equals training that never stopped, for the zoo's
    ``model_id`` (by default the cell's own)."""
    cell, start = PARALLELISMS[cell_name], SAVED_AT[saved]
    model_id = model_id or cell.model_id
    _skip_unless_applies(cell, recipe, model_id)
    plain = plain_trajectory(cell, world, recipe, start + MORE_STEPS, model_id)
    path = _checkpoint_after(start, cell, world, recipe, model_id)
    fresh = fresh_training(cell, world, recipe, model_id)
    resumed = resume(fresh, path, start, model_id)
    parted = first_parting(resumed, plain[start:], LABELS)
    assert parted is None, (
        f"saved after {start} steps, loaded into fresh objects and trained {MORE_STEPS} more, "
        f"training parts from training that never stopped {parted} (steps counted from the load)"
    )


@pytest.mark.world(2, 4, applies=first_size_and_four("cell"))
@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("cell", sorted(PARALLELISMS))
@pytest.mark.parametrize("saved", sorted(SAVED_AT))
def test_resuming_in_fresh_objects_trains_as_never_stopped(world, saved, cell, recipe):
    _assert_resumes_as_never_stopped(world, cell, recipe, saved)


def _trains_the_mlp(size: int, **params: Any) -> bool:
    """``first_size_and_four``, for the cells that train the MLP, whose frozen variant the zoo
    has (``ep`` trains its mixture of experts)."""
    cell = PARALLELISMS[params["cell"]]
    return cell.model_id == DEFAULT_MODEL and first_size_and_four("cell")(size, **params)


@pytest.mark.world(2, 4, applies=_trains_the_mlp)
@pytest.mark.parametrize("cell", sorted(PARALLELISMS))
def test_resuming_with_a_frozen_layer_trains_as_never_stopped(world, cell):
    """``fc1`` frozen: no gradient and no optimizer state, before and after the load."""
    _assert_resumes_as_never_stopped(world, cell, "adamw_step_lr", "after_2_steps", "frozen")


@pytest.mark.world(2, 4, applies=first_size_and_four("cell"))
@pytest.mark.parametrize("cell", sorted(PARALLELISMS))
def test_resuming_with_an_empty_param_group_trains_as_never_stopped(world, cell):
    """Adam with a group per layer and an empty group between them."""
    _assert_resumes_as_never_stopped(world, cell, "adam_groups", "after_2_steps")


RESHARDS = reshards("resume")  # saved by (at 4 ranks), resumed by, at how many ranks
SAVED_STEPS = 2


@pytest.mark.world(4)
@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize(("saved_by", "resumed_by", "size"), RESHARDS)
def test_resuming_under_another_cell_trains_as_one_process(
    world, saved_by, resumed_by, size, recipe
):
    """Saved at 4 ranks after two steps, resumed by another cell at ``size`` ranks, two more
    steps: the full state is the single process's after four."""
    cells = [PARALLELISMS[name] for name in (saved_by, resumed_by) if name in PARALLELISMS]
    for cell in cells:
        cell.skip_unless_runnable(world.device)
    flatten = flattened_between(saved_by, resumed_by)
    model_id = model_between(saved_by, resumed_by)
    path = _checkpoint_after(
        SAVED_STEPS, PARALLELISMS[saved_by], world, recipe, model_id, flatten=flatten
    )
    world.barrier()
    resume_on_the_first_ranks(world, size, (saved_by, resumed_by), path, SAVED_STEPS, recipe)
