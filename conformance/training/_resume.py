"""Resuming from a checkpoint: fresh objects of a cell (or of one process), the load, the steps
that follow, and the single-process state they must reach."""

from __future__ import annotations

from typing import Any

import torch

from conformance._upstream import dsd, full_options
from conformance.cells import (
    DEFAULT_MODEL,
    PARALLELISMS,
    SubWorld,
    comparison_tolerance,
    flattened_between,
)
from conformance.compare import assert_state_dict_equal
from conformance.models.common import GroundTruth, computed_on
from conformance.models.optimizers import OPTIMIZERS
from conformance.models.zoo import MODELS
from conformance.training._dcp import load_checkpoint, load_options_for
from conformance.training._trajectory import (
    Snapshot,
    Training,
    fresh_training,
    train_observed,
    unobserved,
)

MORE_STEPS = 2  # steps trained after a load


def training_in(name: str, world: Any, recipe: str, model_id: str) -> Training:
    """Fresh objects of the zoo's ``model_id`` in the cell ``name``, or on one process alone
    (``single``)."""
    if name == "single":
        model = MODELS[model_id].build().to(world.device)
        return (model, *OPTIMIZERS[recipe].build(model))
    return fresh_training(PARALLELISMS[name], world, recipe, model_id)


def model_between(*names: str) -> str:
    """The zoo's model a checkpoint that passes between the cells ``names`` (and ``single``)
    holds: the model a cell needs (``ep``'s mixture), else the matrix's MLP, which any cell
    trains."""
    needed = {PARALLELISMS[n].model_id for n in names if n in PARALLELISMS} - {DEFAULT_MODEL}
    if len(needed) > 1:
        raise ValueError(f"cells {names} need different models: {sorted(needed)}")
    return needed.pop() if needed else DEFAULT_MODEL


def resume(
    training: Training,
    path: str,
    start: int,
    model_id: str = DEFAULT_MODEL,
    *,
    flatten: bool | None = None,
    **load: Any,
) -> list[Snapshot]:
    """Load ``path`` into ``training``'s fresh objects, then train ``MORE_STEPS`` on the
    inputs that follow step ``start``: a snapshot after each step (``flatten``: the
    checkpoint's optimizer state form, see ``training_state``; ``load`` goes to
    ``dcp.load``)."""
    model, optimizer, scheduler = training
    load_checkpoint(model, optimizer, path, scheduler=scheduler, flatten=flatten, **load)
    inputs = MODELS[model_id].inputs
    return train_observed(
        model, optimizer, scheduler, MORE_STEPS, unobserved, lambda step: inputs(start + step)
    )


def assert_full_state_is_single_process(
    training: Training,
    steps: int,
    recipe: str,
    *,
    model_id: str,
    full_load: bool = False,
    **tolerance: float,
) -> None:
    """The full model, optimizer state and hyper-parameters of ``training`` (of the zoo's
    ``model_id``) equal one process's after ``steps`` steps of ``recipe``, or their part the
    rank holds (``full_load``: see ``assert_state_is_single_process``)."""
    model, optimizer, _ = training
    model_state, optim_state = dsd.get_state_dict(model, optimizer, options=full_options())
    assert_state_is_single_process(
        model_state,
        optim_state,
        steps,
        recipe,
        device=computed_on(model),
        model_id=model_id,
        full_load=full_load,
        held_by=model,
        **tolerance,
    )


def assert_state_is_single_process(
    model_state: dict[str, Any],
    optim_state: dict[str, Any],
    steps: int,
    recipe: str,
    *,
    device: torch.device,
    model_id: str,
    full_load: bool = False,
    held_by: Any = None,
    **tolerance: float,
) -> None:
    """A full model state dict and FQN-keyed optimizer state dict, nested or flattened, equal
    one process's on ``device`` after ``steps`` steps of ``recipe`` of the zoo's ``model_id``
    (the part the model ``held_by`` holds, where given).

    ``full_load``: the optimizer state went through a full load or a checkpoint, which upstream
    flattens and rebuilds, every sequence as a list: a tuple hyper-parameter such as Adam's
    ``betas`` may come back as a list of the same values (FSDP1's load keeps the tuple), so
    both sides' sequences are compared as lists."""
    expected = MODELS[model_id].ground_truth(steps, device, OPTIMIZERS[recipe])
    assert_state_is(
        model_state, optim_state, expected, full_load=full_load, held_by=held_by, **tolerance
    )


def assert_state_is(
    model_state: dict[str, Any],
    optim_state: dict[str, Any],
    expected: GroundTruth,
    *,
    full_load: bool = False,
    held_by: Any = None,
    **tolerance: float,
) -> None:
    """A full model state dict and FQN-keyed optimizer state dict, nested or flattened, equal
    ``expected`` (the part the model ``held_by`` holds, where given; ``full_load``: see
    ``assert_state_is_single_process``)."""
    if held_by is not None:
        expected = expected.held_by(held_by)
    assert_state_dict_equal(model_state, expected.model, **tolerance)
    as_given = _sequences_as_lists if full_load else dict
    if "state" not in optim_state:  # flattened
        flattened = expected.flattened_optimizer_state_dict
        assert_state_dict_equal(as_given(optim_state), as_given(flattened), **tolerance)
        return
    assert_state_dict_equal(optim_state["state"], expected.optimizer_state, **tolerance)
    groups = {str(i): as_given(group) for i, group in enumerate(optim_state["param_groups"])}
    expected_groups = {str(i): as_given(group) for i, group in enumerate(expected.param_groups)}
    assert_state_dict_equal(groups, expected_groups)


def resume_on_the_first_ranks(
    world: Any, size: int, cells: tuple[str, str], path: str, saved_after: int, recipe: str
) -> None:
    """Resume ``path``, saved by ``cells[0]`` after ``saved_after`` steps, in fresh objects of
    ``cells[1]`` on ranks ``0 .. size - 1`` of ``world`` (rank 0 alone, without a process
    group, at 1), train ``MORE_STEPS``, and hold the full state to the single process's
    (within the tolerances of the two cells); every rank of the world calls it, and the
    others wait."""
    resumed_by = cells[1]
    model_id = model_between(*cells)
    compared = [PARALLELISMS[name] for name in cells if name in PARALLELISMS]
    resumers: Any = world
    load: dict[str, Any] = {}
    if size < world.size:
        resumers = SubWorld(world, size)
        load = load_options_for(resumers)
        if not resumers.member:
            world.barrier()
            return
    try:
        training = training_in(resumed_by, resumers, recipe, model_id)
        resume(training, path, saved_after, model_id, flatten=flattened_between(*cells), **load)
        assert_full_state_is_single_process(
            training,
            saved_after + MORE_STEPS,
            recipe,
            model_id=model_id,
            **comparison_tolerance(*compared),
        )
    finally:
        world.barrier()


def _sequences_as_lists(group: dict[str, Any]) -> dict[str, Any]:
    """A param group with its tuple values as lists: hyper-parameters compared as values."""
    return {key: list(value) if isinstance(value, tuple) else value for key, value in group.items()}
