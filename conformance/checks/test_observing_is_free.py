"""Observing is free: reading a state dict leaves training exactly as it was.

Judged against the same training without the reads, not against the oracle. The reads of a
model's or an optimizer's state dict:

- ``get_model_state_dict``, ``get_optimizer_state_dict`` and ``get_state_dict``, with and
  without every option;
- ``nn.Module.state_dict``;
- FSDP1's state-dict types, ``optim_state_dict`` and its legacy optimizer APIs.

Every read must leave the model, its gradients, the optimizer and the scheduler bit for bit
as they were. That holds right after the read and over the steps that follow. Reads happen
before the first step, between steps and after a ``zero_grad``. Each cell runs at its
smallest world size above one and at 4. The optimizers are Adam, AdamW, SGD with momentum,
and AdamW under a StepLR scheduler. Model reads, which do not touch the optimizer, run under
the last only, at every moment in one run.

A read may build state lazily (an optimizer's zero state) so long as training does not
change. A failure names the first step at which the trajectories part, the key and both
values. Below that, it lists each read that changed the training state right away, with the
moment, the key and both values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from conformance._upstream import dsd, fsdp, full_options, quiet_deprecations
from conformance.cells import PARALLELISMS, Parallelism, first_size_and_four
from conformance.models.common import batch
from conformance.models.optimizers import OPTIMIZERS
from conformance.training import (
    AFTER_ZERO_GRAD,
    BEFORE_FIRST_STEP,
    BETWEEN_STEPS,
    FSDP1_CELLS,
    MODEL_KINDS,
    OPTIM_KINDS,
    differences,
    first_parting,
    fresh_training,
    fsdp1_api,
    plain_trajectory,
    snapshot,
    torch_model_state_dict,
    train_observed,
    under_optim_settings,
)

STEPS = 3
RECIPES = ("adam", "adamw", "sgd_momentum", "adamw_step_lr")
Read = Callable[[torch.nn.Module, torch.optim.Optimizer], object]


def _every_option(cpu_offload: bool = True) -> Any:
    return full_options(
        cpu_offload=cpu_offload,
        ignore_frozen_params=True,
        keep_submodule_prefixes=False,
        flatten_optimizer_state_dict=True,
    )


def _every_option_of(cell: Parallelism) -> tuple[str, Any]:
    """A read's name and every option, but FSDP1's offloaded full state dicts, which have
    their own test (they crash releases before 2.14.1: pytorch#188989)."""
    if cell.fsdp1:
        return "every option but cpu_offload", _every_option(cpu_offload=False)
    return "every option", _every_option()


def model_reads(cell: Parallelism) -> dict[str, Read]:
    """The reads of a model's state dict that apply to ``cell``."""
    label, options = _every_option_of(cell)
    reads: dict[str, Read] = {
        "nn.Module.state_dict()": lambda model, _: model.state_dict(),
        "get_model_state_dict()": lambda model, _: dsd.get_model_state_dict(model),
        f"get_model_state_dict({label})": lambda model, _: dsd.get_model_state_dict(
            model, options=options
        ),
    }
    if cell.fsdp1:
        # LOCAL_STATE_DICT refuses modules given a device mesh (the HYBRID_SHARD cells).
        kinds = [k for k in MODEL_KINDS if not (k.startswith("local") and cell.fsdp1_mesh)]
        for kind in kinds:
            reads[f"FSDP1 state_dict ({kind})"] = lambda model, _, kind=kind: (
                torch_model_state_dict(model, kind)
            )
    return reads


def optimizer_reads(cell: Parallelism) -> dict[str, Read]:
    """The reads of an optimizer's state dict (with its model's) that apply to ``cell``."""
    label, options = _every_option_of(cell)
    reads: dict[str, Read] = {
        "get_optimizer_state_dict()": lambda model, optim: dsd.get_optimizer_state_dict(
            model, optim
        ),
        f"get_optimizer_state_dict({label})": lambda model, optim: dsd.get_optimizer_state_dict(
            model, optim, options=options
        ),
        "get_state_dict()": lambda model, optim: dsd.get_state_dict(model, optim),
        f"get_state_dict({label})": lambda model, optim: dsd.get_state_dict(
            model, optim, options=options
        ),
    }
    if cell.fsdp1:
        for kind in OPTIM_KINDS:
            reads[f"FSDP1 optim_state_dict ({kind})"] = lambda model, optim, kind=kind: (
                under_optim_settings(
                    model,
                    kind,
                    lambda: fsdp.FullyShardedDataParallel.optim_state_dict(model, optim),
                )
            )
        for name in ("full_optim_state_dict", "sharded_optim_state_dict"):
            reads[f"FSDP1 {name}"] = lambda model, optim, name=name: fsdp1_api(name)(model, optim)
    return reads


OFFLOADED_READS: dict[str, Read] = {
    "get_model_state_dict(every option)": lambda model, _: dsd.get_model_state_dict(
        model, options=_every_option()
    ),
    "get_state_dict(every option)": lambda model, optim: dsd.get_state_dict(
        model, optim, options=_every_option()
    ),
}


def _run(
    cell: Parallelism, world: Any, recipe: str, reads: dict[str, Read], moments: set[str]
) -> tuple[list[dict[str, Any]], list[str]]:
    """A fresh model trained ``STEPS`` steps with ``reads`` at ``moments``: a snapshot after
    each step, and what each read changed in the training state right away."""
    model, optimizer, scheduler = fresh_training(cell, world, recipe)
    changes: list[str] = []

    def observe(moment: str) -> None:
        if moment not in moments:
            return
        for name, read in reads.items():
            before = snapshot(model, optimizer, scheduler)
            with quiet_deprecations():
                read(model, optimizer)
            changed = differences(
                snapshot(model, optimizer, scheduler), before, ("after it", "before it")
            )
            if changed:
                changes.append(f"{name} {moment} changed " + "; ".join(changed))

    return train_observed(model, optimizer, scheduler, STEPS, observe, batch), changes


MOMENTS = {  # by test id: the moments of a run at which the reads happen
    "before_first_step": {BEFORE_FIRST_STEP},
    "later": {BETWEEN_STEPS, AFTER_ZERO_GRAD},
}
EVERY_MOMENT = {BEFORE_FIRST_STEP, BETWEEN_STEPS, AFTER_ZERO_GRAD}


def _assert_reads_leave_training(
    world: Any, cell: str, recipe: str, reads: dict[str, Read], moments: set[str]
) -> None:
    parallelism = PARALLELISMS[cell]
    plain = plain_trajectory(parallelism, world, recipe, STEPS)
    observed, changes = _run(parallelism, world, recipe, reads, moments)
    parted = first_parting(observed, plain, ("with the reads", "without them"))
    assert parted is None, (
        f"training with {', '.join(reads)} ({', '.join(sorted(moments))}) parts from "
        f"training without them {parted}" + "".join(f"\n  {change}" for change in changes)
    )


@pytest.mark.world(2, 4, applies=first_size_and_four("cell"))
@pytest.mark.parametrize("cell", sorted(PARALLELISMS))
def test_reading_the_model_state_leaves_training_as_it_was(world, cell):
    """Model reads at every moment of one run, under AdamW and a StepLR scheduler."""
    reads = model_reads(PARALLELISMS[cell])
    _assert_reads_leave_training(world, cell, "adamw_step_lr", reads, EVERY_MOMENT)


@pytest.mark.world(2, 4, applies=first_size_and_four("cell"))
@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("cell", sorted(PARALLELISMS))
@pytest.mark.parametrize("when", sorted(MOMENTS))
def test_reading_the_optimizer_state_leaves_training_as_it_was(world, when, cell, recipe):
    OPTIMIZERS[recipe].skip_unless_applies(PARALLELISMS[cell])
    reads = optimizer_reads(PARALLELISMS[cell])
    _assert_reads_leave_training(world, cell, recipe, reads, MOMENTS[when])


@pytest.mark.world(2, 4, applies=first_size_and_four("cell"))
@pytest.mark.parametrize("cell", FSDP1_CELLS)
def test_reading_fsdp1_offloaded_full_state_dicts_leaves_training_as_it_was(world, cell):
    """FSDP1's full state dicts offloaded to the CPU, at every moment of one run, under SGD
    with momentum (whose state creation changes no value, except where a rank's shard of a
    parameter is empty: see the manifest's pytorch#164929 entries)."""
    _assert_reads_leave_training(world, cell, "sgd_momentum", OFFLOADED_READS, EVERY_MOMENT)
