"""Observing is free: reading a state dict leaves training exactly as it was.

Judged against the same training without the reads, not against the oracle: every read of
a model's or an optimizer's state dict (``get_model_state_dict``, ``get_optimizer_state_dict``
and ``get_state_dict`` with and without every option; ``nn.Module.state_dict``; FSDP1's
state-dict types, ``optim_state_dict`` and its legacy optimizer APIs) must leave the model,
its gradients, the optimizer and the scheduler bit for bit as they were, right after the
read and over the steps that follow. Reads happen before the first step, between steps and
after a ``zero_grad``, on every cell at its smallest world size above one and at 4, with
Adam, AdamW, SGD with momentum, and AdamW under a StepLR scheduler.

A read may build state lazily (an optimizer's zero state) so long as training does not
change. A failure names the first step at which the trajectories part, the key and both
values, and below it each read that changed the training state right away, with the moment,
the key and both values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from conformance._fsdp1 import (
    MODEL_KINDS,
    OPTIM_KINDS,
    fsdp1_api,
    torch_model_state_dict,
    under_optim_settings,
)
from conformance._optimizers import OPTIMIZERS
from conformance._parallelisms import PARALLELISMS, Parallelism, first_size_and_four
from conformance._trajectory import (
    AFTER_ZERO_GRAD,
    BEFORE_FIRST_STEP,
    BETWEEN_STEPS,
    differences,
    first_parting,
    snapshot,
    train_observed,
)
from conformance._upstream import dsd, fsdp, full_options, quiet_deprecations
from conformance.models.common import batch, seeded_mlp

STEPS = 3
RECIPES = ("adam", "adamw", "sgd_momentum", "adamw_step_lr")
Read = Callable[[torch.nn.Module, torch.optim.Optimizer], object]


def _every_option() -> Any:
    return full_options(
        cpu_offload=True,
        ignore_frozen_params=True,
        keep_submodule_prefixes=False,
        flatten_optimizer_state_dict=True,
    )


def model_reads(cell: Parallelism) -> dict[str, Read]:
    """The reads of a model's state dict that apply to ``cell``."""
    reads: dict[str, Read] = {
        "nn.Module.state_dict()": lambda model, _: model.state_dict(),
        "get_model_state_dict()": lambda model, _: dsd.get_model_state_dict(model),
        "get_model_state_dict(every option)": lambda model, _: dsd.get_model_state_dict(
            model, options=_every_option()
        ),
    }
    if cell.fsdp1:
        for kind in MODEL_KINDS:
            reads[f"FSDP1 state_dict ({kind})"] = lambda model, _, kind=kind: (
                torch_model_state_dict(model, kind)
            )
    return reads


def optimizer_reads(cell: Parallelism) -> dict[str, Read]:
    """The reads of an optimizer's state dict (with its model's) that apply to ``cell``."""
    reads: dict[str, Read] = {
        "get_optimizer_state_dict()": lambda model, optim: dsd.get_optimizer_state_dict(
            model, optim
        ),
        "get_optimizer_state_dict(every option)": lambda model, optim: dsd.get_optimizer_state_dict(
            model, optim, options=_every_option()
        ),
        "get_state_dict()": lambda model, optim: dsd.get_state_dict(model, optim),
        "get_state_dict(every option)": lambda model, optim: dsd.get_state_dict(
            model, optim, options=_every_option()
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


def _run(
    cell: Parallelism, world: Any, recipe: str, reads: dict[str, Read], moments: set[str]
) -> tuple[list[dict[str, Any]], list[str]]:
    """A fresh model trained ``STEPS`` steps with ``reads`` at ``moments``: a snapshot after
    each step, and what each read changed in the training state right away."""
    model = cell.parallelise(seeded_mlp(), world)
    optimizer, scheduler = OPTIMIZERS[recipe].build(model)
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


@pytest.mark.world(2, 4, applies=first_size_and_four("cell"))
@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("cell", sorted(PARALLELISMS))
@pytest.mark.parametrize("when", sorted(MOMENTS))
@pytest.mark.parametrize("reads", ["model", "optimizer"])
def test_reading_a_state_dict_leaves_training_as_it_was(world, reads, when, cell, recipe):
    parallelism = PARALLELISMS[cell]
    OPTIMIZERS[recipe].skip_unless_applies(parallelism)
    catalogue = (model_reads if reads == "model" else optimizer_reads)(parallelism)
    plain, _ = _run(parallelism, world, recipe, {}, set())
    observed, changes = _run(parallelism, world, recipe, catalogue, MOMENTS[when])
    parted = first_parting(observed, plain, ("with the reads", "without them"))
    assert parted is None, (
        f"training with {', '.join(catalogue)} ({', '.join(sorted(MOMENTS[when]))}) parts "
        f"from training without them "
        f"{parted}" + "".join(f"\n  {change}" for change in changes)
    )
