"""The models of the matrix: each a seeded model, its inputs, and the variants around it.

A recipe builds the same model on every rank and in the single-process ground truth.
Variants change how the model runs, never its state: activation checkpointing wraps its
units (``_checkpoint_wrapped_module.`` in the raw keys), ``torch.compile`` wraps the
parallelised model (``compiled``) or, before the wrapping, each unit in its place
(``compiled_blocks``, as recipes compile blocks before FSDP wraps them): ``_orig_mod.`` in
the raw keys. Canonical state dicts must show none of these.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from conformance._upstream import activation_checkpointing
from conformance.cells import Parallelism, replace_submodule, units
from conformance.models.common import (
    SEED,
    GroundTruth,
    MLPWithBuffers,
    batch,
    ground_truth,
    seeded_mlp,
    seeded_tied,
    tokens,
    train,
)
from conformance.models.experts import seeded_mixture
from conformance.models.transformer import seeded_transformer

VARIANTS = ("plain", "checkpointed", "compiled", "compiled_blocks")
TRAIN_STEPS = 2


class Calibration(nn.Module):
    """State that is no tensor: a count of forward passes, through ``get_extra_state``."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen += 1
        return x

    def get_extra_state(self) -> dict[str, Any]:
        return {"seen": self.seen, "unit": "batches"}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        self.seen = state["seen"]


class MLPWithExtraState(MLPWithBuffers):
    def __init__(self) -> None:
        super().__init__()
        self.calibration = Calibration()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(self.calibration(x))


def _seeded_extra_state() -> nn.Module:
    torch.manual_seed(SEED)
    return MLPWithExtraState()


def _seeded_frozen() -> nn.Module:
    """The MLP with ``fc1`` frozen: its parameters get no gradient and no optimizer state."""
    model = seeded_mlp()
    model.fc1.requires_grad_(False)
    return model


@dataclass(frozen=True)
class ModelRecipe:
    """A named model of the matrix in one ``variant``; ``inputs(step)`` is its batch."""

    name: str
    build: Callable[[], nn.Module]
    inputs: Callable[[int], torch.Tensor]
    variant: str = "plain"
    # FSDP1 flat parameters need one requires_grad per flat parameter.
    mixed_requires_grad: bool = False

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"{self.name}: variant must be one of {VARIANTS}, not {self.variant}")

    @property
    def id(self) -> str:
        return self.name if self.variant == "plain" else f"{self.name}_{self.variant}"

    def unsupported(self, cell: Parallelism) -> str | None:
        """Why ``cell`` cannot wrap this model, or None (a model without a TP plan is
        skipped by the TP cells themselves)."""
        if self.mixed_requires_grad and cell.flat_params and not cell.nested:
            return "one FSDP1 flat parameter cannot mix frozen and trainable parameters"
        if self.variant in ("checkpointed", "compiled_blocks") and not units(self.build()):
            return f"{self.name} has no units to wrap ({self.variant})"
        if self.variant == "compiled_blocks" and cell.family in ("tp", "2-D"):
            return (
                "a TP plan shards the blocks' own layers, so recipes compile blocks after TP; "
                "this variant compiles them before any wrapping"
            )
        return None

    def make(self, cell: Parallelism, world: Any) -> nn.Module:
        """The model, parallelised by ``cell``, in this recipe's variant."""
        model = self.build()
        if self.variant == "compiled_blocks":
            for unit in units(model):
                compiled = torch.compile(model.get_submodule(unit), backend="eager")
                replace_submodule(model, unit, compiled)
        targets = {id(model.get_submodule(unit)) for unit in units(model)}
        wrapped = cell.parallelise(model, world)
        if self.variant == "checkpointed":
            activation_checkpointing.apply_activation_checkpointing(
                wrapped, check_fn=lambda module: id(module) in targets
            )
        if self.variant == "compiled":
            wrapped = torch.compile(wrapped, backend="eager")  # CPU-safe: no code generation
        return wrapped

    def train(self, model: nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
        """``steps`` steps on this model's inputs."""
        train(model, optimizer, steps, inputs=self.inputs)

    def ground_truth(self, steps: int, device: torch.device, recipe: Any = None) -> GroundTruth:
        """The single-process model after ``steps`` steps of ``recipe`` (default Adam) on
        ``device``: what every cell must equal."""
        return ground_truth(steps, recipe, device=device, build=self.build, inputs=self.inputs)


def _catalogue() -> dict[str, ModelRecipe]:
    bases = [
        ModelRecipe("mlp", seeded_mlp, batch),
        ModelRecipe("tied", seeded_tied, tokens),
        ModelRecipe("frozen", _seeded_frozen, batch, mixed_requires_grad=True),
        ModelRecipe("extra_state", _seeded_extra_state, batch),
        ModelRecipe("transformer", seeded_transformer, tokens),
        ModelRecipe("moe", seeded_mixture, batch),
    ]
    recipes = list(bases)
    for base in (bases[0], bases[4]):
        for variant in VARIANTS[1:]:
            recipes.append(ModelRecipe(base.name, base.build, base.inputs, variant))
    return {recipe.id: recipe for recipe in recipes}


MODELS = _catalogue()


def model_of(cell: Parallelism, world: Any) -> nn.Module:
    """The model ``cell`` trains (``Parallelism.model_id``), fresh from its seed, wrapped by
    ``cell``."""
    return MODELS[cell.model_id].make(cell, world)


def truth_of(cell: Parallelism, steps: int, recipe: Any, device: torch.device) -> GroundTruth:
    """One process's state on ``device`` after ``steps`` steps of ``recipe`` of the model
    ``cell`` trains: what the cell must equal."""
    return MODELS[cell.model_id].ground_truth(steps, device, recipe)
