"""The optimizers of the matrix: how each is built on a (possibly wrapped) MLP.

Param groups are chosen by canonical layer name (``fc1``/``fc2``), so the
same recipe gives the same groups on the single-process model and on every
parallelism whose optimizer sees per-layer parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from conformance.cells import Parallelism

Scheduler = torch.optim.lr_scheduler.LRScheduler
Build = Callable[[nn.Module], tuple[torch.optim.Optimizer, Scheduler | None]]


@dataclass(frozen=True)
class OptimizerRecipe:
    """A named optimizer set-up; ``per_layer_groups`` needs parameters that are whole layers.

    FSDP1 without ``use_orig_params`` hands the optimizer flat parameters that
    span layers, so recipes with per-layer groups do not apply to it.
    """

    name: str
    build: Build
    per_layer_groups: bool = False

    def applies_to(self, parallelism: Parallelism) -> bool:
        return not (self.per_layer_groups and parallelism.flat_params)

    def skip_unless_applies(self, cell: Parallelism) -> None:
        """Skip the calling test where this recipe does not apply to ``cell``."""
        if not self.applies_to(cell):
            pytest.skip("flat parameters span layers: no per-layer param groups")


def _layer(model: nn.Module, layer: str) -> list[nn.Parameter]:
    return [p for name, p in model.named_parameters() if f"{layer}." in f".{name}"]


def _plain(factory: Callable[[list[nn.Parameter]], torch.optim.Optimizer]) -> Build:
    def build(model: nn.Module) -> tuple[torch.optim.Optimizer, Scheduler | None]:
        return factory(list(model.parameters())), None

    return build


def _groups(model: nn.Module) -> tuple[torch.optim.Optimizer, Scheduler | None]:
    groups = [
        {"params": _layer(model, "fc1"), "lr": 0.01},
        {"params": [], "lr": 0.5},  # an empty group must survive every round trip
        {"params": _layer(model, "fc2"), "lr": 0.02, "betas": (0.8, 0.99)},
    ]
    return torch.optim.Adam(groups), None


def _scheduled(model: nn.Module) -> tuple[torch.optim.Optimizer, Scheduler | None]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.02, weight_decay=0.1)
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)


OPTIMIZERS: dict[str, OptimizerRecipe] = {
    recipe.name: recipe
    for recipe in (
        OptimizerRecipe("sgd", _plain(lambda p: torch.optim.SGD(p, lr=0.1))),
        OptimizerRecipe("sgd_momentum", _plain(lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9))),
        OptimizerRecipe("adam", _plain(lambda p: torch.optim.Adam(p, lr=0.01))),
        OptimizerRecipe("adamw", _plain(lambda p: torch.optim.AdamW(p, lr=0.01))),
        OptimizerRecipe("adam_groups", _groups, per_layer_groups=True),
        OptimizerRecipe("adamw_step_lr", _scheduled),
    )
}


def adam(model: nn.Module) -> torch.optim.Optimizer:
    """The matrix's plain Adam (lr 0.01) over every parameter of ``model``."""
    return OPTIMIZERS["adam"].build(model)[0]


def sgd(model: nn.Module) -> torch.optim.Optimizer:
    """The matrix's plain SGD (lr 0.1, no momentum) over every parameter of ``model``."""
    return OPTIMIZERS["sgd"].build(model)[0]
