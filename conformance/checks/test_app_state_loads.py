"""The documented ways to save and load through ``dcp.save`` and ``dcp.load``, and partial loads.

Each cell trains ``SAVED_AFTER`` steps and saves its training state. Fresh
objects of the same cell load, train ``MORE_STEPS`` more, and must hold what
``SAVED_AFTER + MORE_STEPS`` single-process steps give (bit for bit, within the cell's
tolerance). ``dcp.load`` fills the dicts and ``Stateful`` objects it is given in place: each
is still the object handed to it. The ways of saving and loading:

- ``app_state``: DCP's recipe. An object holds the model and optimizer. Its ``state_dict`` is
  ``get_state_dict`` and its ``load_state_dict`` is ``set_state_dict``, so it meets DCP's
  ``Stateful`` protocol. It is saved and loaded as ``{"app": app_state}``, and DCP calls those
  two methods itself.
- ``patched``: ``_patch_model_state_dict`` and ``_patch_optimizer_state_dict`` make the
  model's and optimizer's own ``state_dict`` and ``load_state_dict`` the distributed ones. The
  loop saves and loads through those methods, as code written for one process does.
- ``flattened_then_nested`` / ``nested_then_flattened``: the optimizer state is saved in one
  form (``flatten_optimizer_state_dict``). It is read back through a template of that form,
  since a checkpoint's keys are those of the form it was saved in. Then it is given to
  ``set_optimizer_state_dict`` with the options of the other form. Either form loads.

A rank that holds a part of the model (a pipeline stage, its experts) saves its optimizer
state flattened. That is the form upstream gives for MPMD
(``conformance/training/_dcp.py``). Its app state and patched methods use that form.
The two ways that cross forms do not apply to parts: they are not collected at the sizes
where ``pp`` and ``ep`` split the model.

The ``Stateful`` ways also go through ``async_save`` (thread and process checkpointers) on
the golden cells, beside a ``Stateful`` holding a tensor and a train state holding a
``BytesIO``: each comes back from ``dcp.load`` as saved, and the run resumes as one process.

Loads of part of a checkpoint:

- A checkpoint of the model and the optimizer, of which the model's state alone is loaded
  (the optimizer state is left unread). The model holds the single-process values after
  ``SAVED_AFTER`` steps, and the fresh optimizer is untouched.
- ``fc1``'s keys alone, set with ``strict=False``. Those keys hold the saved values, and every
  other key keeps the fresh model's value.
- A checkpoint of the model without ``fc1``: a pretrained body, kept for a model whose first
  layer is new. It is loaded into the templates of the model and the optimizer with
  ``DefaultLoadPlanner(allow_partial_load=True)``. Every key it holds is loaded, and ``fc1``
  and the optimizer's template keep their fresh values. Without ``allow_partial_load`` the
  load raises ``CheckpointException`` on every rank, naming ``model.fc1.weight``. It then
  changes no value of the template.

``CheckpointException`` derives from ``BaseException`` (2.6.0, 2.13.0 and 2.15.0 alike), so an
``except Exception`` does not catch it. The mutant
``partial_load_stops_at_the_first_missing_key`` (a partial load that plans nothing after the
first key the checkpoint lacks) is seen by this module only.
"""

from __future__ import annotations

import copy
import io
import re
from collections.abc import Callable
from typing import Any, Literal

import pytest
import torch
import torch.distributed as dist
from torch import nn

from conformance._upstream import dcp, dsd, full_options
from conformance.cells import (
    PARALLELISMS,
    Parallelism,
    comparison_tolerance,
    exists_at_size,
    with_role,
)
from conformance.compare import (
    assert_state_dict_equal,
    assert_trees_identical,
    holds_a_part,
    local_copy,
)
from conformance.models.common import train
from conformance.models.optimizers import OPTIMIZERS
from conformance.models.zoo import truth_of
from conformance.training import (
    CHECKPOINTERS,
    MORE_STEPS,
    Training,
    assert_full_state_is_single_process,
    fresh_training,
    save_checkpoint,
    skip_unless_checkpointer,
    start_async_save,
    trained,
)

Way = Literal["app_state", "patched", "flattened_then_nested", "nested_then_flattened"]
WAYS: tuple[Way, ...] = ("app_state", "patched", "flattened_then_nested", "nested_then_flattened")
RECIPE = "adam"
SAVED_AFTER = 2
CELLS = sorted(PARALLELISMS)
LOADED_ALONE = "fc1."  # the keys a load of some keys asks for
NEW_LAYER = "fc1."  # the layer a partial checkpoint lacks, as a fine-tuned model's new layer


class AppState:
    """A model and its optimizer as one checkpointed object, as DCP's recipe writes it."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer
        self.options = _flattened(holds_a_part(model))

    def state_dict(self) -> dict[str, Any]:
        model_state, optim_state = dsd.get_state_dict(
            self.model, self.optimizer, options=self.options
        )
        return {"model": model_state, "optim": optim_state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        dsd.set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=self.options,
        )


def _flattened(flattened: bool) -> Any:
    return dsd.StateDictOptions(flatten_optimizer_state_dict=flattened)


def _patch(training: Training) -> None:
    model, optimizer, _ = training
    options = _flattened(holds_a_part(model))
    dsd._patch_model_state_dict(model, options=options)
    dsd._patch_optimizer_state_dict(model, optimizers=(optimizer,), options=options)


CROSSING: tuple[Way, ...] = ("flattened_then_nested", "nested_then_flattened")


def _way_applies(size: int, cell: str, way: Way) -> bool:
    """The cell exists at ``size``, and a way that crosses forms is not asked of a model's
    parts (they save flattened state only)."""
    parallelism = PARALLELISMS[cell]
    staged = parallelism.partial and size > 1
    return parallelism.supports(size) and not (staged and way in CROSSING)


def _checkpointed(way: Way, training: Training) -> dict[str, Any]:
    """What a loop saving and loading in ``way`` hands ``dcp.save``, and ``dcp.load`` as its
    template: the optimizer state in the form it is saved in."""
    model, optimizer, _ = training
    if way == "app_state":
        return {"app": AppState(model, optimizer)}
    if way == "patched":
        _patch(training)
        return {"model": model.state_dict(), "optim": optimizer.state_dict()}
    options = _flattened(way == "flattened_then_nested")
    model_state, optim_state = dsd.get_state_dict(model, optimizer, options=options)
    return {"model": model_state, "optim": optim_state}


def _put_back(way: Way, training: Training, loaded: dict[str, Any]) -> None:
    """After ``dcp.load``: the loaded state set into the model and optimizer (an app state
    has set itself), the optimizer's in the form other than it was saved in."""
    model, optimizer, _ = training
    if way == "patched":
        model.load_state_dict(loaded["model"])
        optimizer.load_state_dict(loaded["optim"])
    elif way != "app_state":
        dsd.set_state_dict(
            model,
            optimizer,
            model_state_dict=loaded["model"],
            optim_state_dict=loaded["optim"],
            options=_flattened(way == "nested_then_flattened"),
        )


def _put_back_and_train_on(
    way: Way, resuming: Training, loaded: dict[str, Any], parallelism: Parallelism
) -> None:
    """The loaded state set into ``resuming``, ``MORE_STEPS`` trained: it must hold what one
    process holds after ``SAVED_AFTER + MORE_STEPS`` steps."""
    _put_back(way, resuming, loaded)
    train(resuming[0], resuming[1], MORE_STEPS, start=SAVED_AFTER)
    assert_full_state_is_single_process(
        resuming,
        SAVED_AFTER + MORE_STEPS,
        RECIPE,
        model_id=parallelism.model_id,
        **comparison_tolerance(parallelism),
    )


@pytest.mark.world(1, 2, 4, applies=_way_applies)
@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("cell", CELLS)
def test_each_documented_way_resumes_as_one_process(world, cell, way):
    parallelism = PARALLELISMS[cell]
    parallelism.skip_unless_runnable(world.device)
    path = str(world.tmp_path / "checkpoint")
    saving = trained(parallelism, world, RECIPE, SAVED_AFTER)
    dcp.save(_checkpointed(way, saving), checkpoint_id=path)
    resuming = fresh_training(parallelism, world, RECIPE)
    template = _checkpointed(way, resuming)
    given = dict(template)
    dcp.load(template, checkpoint_id=path)
    for key, value in given.items():
        assert template[key] is value, (
            f"rank {world.rank}: dcp.load replaced the {type(value).__name__} under {key!r} "
            "instead of loading into it"
        )
    _put_back_and_train_on(way, resuming, template, parallelism)


class _Counter:
    """A ``Stateful`` beside the training state: a tensor of its own."""

    def __init__(self, value: float) -> None:
        self.value = torch.full((3,), value)

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = state["value"].clone()


def _beside(value: float) -> dict[str, Any]:
    """What upstream's end-to-end save holds beside the model: a ``Stateful`` holding a tensor
    and a train state holding a ``BytesIO``."""
    blob = io.BytesIO()
    torch.save({"step": int(value)}, blob)
    return {"counter": _Counter(value), "train_state": {"step": torch.tensor(value), "blob": blob}}


@pytest.mark.world(2, 4, applies=exists_at_size("cell"))
@pytest.mark.parametrize("checkpointer", CHECKPOINTERS)
@pytest.mark.parametrize("way", ["app_state", "patched"])
@pytest.mark.parametrize("cell", with_role("golden"))
def test_an_async_save_of_stateful_objects_resumes_as_one_process(world, cell, way, checkpointer):
    """``async_save`` of the ``Stateful`` ways, beside a ``Stateful`` holding a tensor and a
    train state holding a ``BytesIO``, with the thread and the process checkpointer: ``dcp.load``
    brings every object back as saved, and the run resumes as one process trains."""
    parallelism = PARALLELISMS[cell]
    parallelism.skip_unless_runnable(world.device)
    skip_unless_checkpointer(checkpointer)
    path = world.tmp_path / "checkpoint"
    saving = trained(parallelism, world, RECIPE, SAVED_AFTER)
    group = dist.new_group(backend="gloo")
    state = {**_checkpointed(way, saving), **_beside(7.0)}
    start_async_save(state, path, None, checkpointer, group).finish()
    resuming = fresh_training(parallelism, world, RECIPE)
    template = {**_checkpointed(way, resuming), **_beside(0.0)}
    dcp.load(template, checkpoint_id=str(path))
    assert_trees_identical(
        template["counter"].value, torch.full((3,), 7.0), f"rank {world.rank}: counter.value"
    )
    assert_trees_identical(
        template["train_state"], _beside(7.0)["train_state"], f"rank {world.rank}: train_state"
    )
    _put_back_and_train_on(way, resuming, template, parallelism)


def _saved_checkpoint(parallelism: Any, world: Any, *, body_only: bool = False) -> str:
    """A checkpoint of the cell after ``SAVED_AFTER`` steps: its model and optimizer state,
    or (``body_only``) its model state without ``NEW_LAYER``'s keys, as a pretrained body is
    kept for a model whose first layer is new."""
    path = str(world.tmp_path / "checkpoint")
    model, optimizer, _ = trained(parallelism, world, RECIPE, SAVED_AFTER)
    if body_only:
        state = dsd.get_model_state_dict(model)
        body = {key: value for key, value in state.items() if not key.startswith(NEW_LAYER)}
        dcp.save({"model": body}, checkpoint_id=path)
    else:
        save_checkpoint(model, optimizer, path)
    return path


def _full_state(training: Training) -> dict[str, Any]:
    """The full model and optimizer state of ``training``, copied."""
    model, optimizer, _ = training
    model_state, optim_state = dsd.get_state_dict(model, optimizer, options=full_options())
    return copy.deepcopy({"model": model_state, "optim": optim_state})


def _saved_where(
    loaded: Callable[[str], bool], before: dict[str, Any], cell: Parallelism, device: torch.device
) -> dict[str, Any]:
    """The full model state ``before`` a load, with the saved (single-process, of ``cell``'s
    model on ``device``) values of the keys the load ``loaded``."""
    saved = truth_of(cell, SAVED_AFTER, OPTIMIZERS[RECIPE], device).model
    return {key: saved[key] if loaded(key) else value for key, value in before.items()}


@pytest.mark.world(1, 2, 4, applies=exists_at_size("cell"))
@pytest.mark.parametrize("keys", ["model", LOADED_ALONE])
@pytest.mark.parametrize("cell", CELLS)
def test_a_load_of_some_keys_loads_those_and_leaves_the_rest(world, cell, keys):
    parallelism = PARALLELISMS[cell]
    parallelism.skip_unless_runnable(world.device)
    tolerance = comparison_tolerance(parallelism)
    path = _saved_checkpoint(parallelism, world)
    training = fresh_training(parallelism, world, RECIPE)
    before = _full_state(training)
    prefix = "" if keys == "model" else LOADED_ALONE
    model_state = dsd.get_model_state_dict(training[0])
    model_state = {key: value for key, value in model_state.items() if key.startswith(prefix)}
    dcp.load({"model": model_state}, checkpoint_id=path)
    options = dsd.StateDictOptions(strict=False)
    dsd.set_model_state_dict(training[0], model_state, options=options)
    after = _full_state(training)
    expected = _saved_where(
        lambda key: key.startswith(prefix), before["model"], parallelism, world.device
    )
    assert_state_dict_equal(after["model"], expected, **tolerance)
    assert_state_dict_equal(after["optim"], before["optim"], **tolerance)


def _template_the_checkpoint_half_fills(cell: str, world: Any) -> tuple[Training, Any, str]:
    """A checkpoint of the cell's model without ``NEW_LAYER``, and the templates of a fresh
    model and optimizer of the cell: the training, the templates, the checkpoint's path."""
    parallelism = PARALLELISMS[cell]
    parallelism.skip_unless_runnable(world.device)
    path = _saved_checkpoint(parallelism, world, body_only=True)
    training = fresh_training(parallelism, world, RECIPE)
    model_state, optim_state = dsd.get_state_dict(training[0], training[1])
    return training, {"model": model_state, "optim": optim_state}, path


@pytest.mark.world(1, 2, 4, applies=exists_at_size("cell"))
@pytest.mark.parametrize("cell", CELLS)
def test_a_partial_load_fills_what_the_checkpoint_has(world, cell):
    tolerance = comparison_tolerance(PARALLELISMS[cell])
    training, template, path = _template_the_checkpoint_half_fills(cell, world)
    before = _full_state(training)
    optimizer_before = local_copy(template["optim"])
    planner = dcp.DefaultLoadPlanner(allow_partial_load=True)
    dcp.load(template, checkpoint_id=path, planner=planner)
    assert_state_dict_equal(local_copy(template["optim"]), optimizer_before, **tolerance)
    dsd.set_model_state_dict(training[0], template["model"])
    expected = _saved_where(
        lambda key: not key.startswith(NEW_LAYER), before["model"], PARALLELISMS[cell], world.device
    )
    assert_state_dict_equal(_full_state(training)["model"], expected, **tolerance)


@pytest.mark.world(1, 2, 4, applies=exists_at_size("cell"))
@pytest.mark.parametrize("cell", CELLS)
def test_a_load_of_keys_the_checkpoint_lacks_names_one_and_changes_nothing(world, cell):
    _, template, path = _template_the_checkpoint_half_fills(cell, world)
    before = local_copy(template)
    missing = re.escape(f"Missing key in checkpoint state_dict: model.{NEW_LAYER}")
    with pytest.raises(dcp.CheckpointException, match=missing):
        dcp.load(template, checkpoint_id=path)
    assert_state_dict_equal(local_copy(template), before)
