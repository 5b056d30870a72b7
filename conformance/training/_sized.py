"""The sized model in a cell after one Adam step: the state the memory and many-save checks
measure."""

from __future__ import annotations

from typing import Any

import torch

from conformance.cells import Parallelism
from conformance.models.sized import WIDE_LAYERS, seeded_wide_and_narrow, wide_batch


def sized_model_after_a_step(
    cell: Parallelism, world: Any, wide_layers: int = WIDE_LAYERS
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """``conformance.models.sized`` with ``wide_layers`` in ``cell`` and its Adam optimizer,
    after one step. Adam steps each parameter alone, as it does by default on the CPU: under
    TP the model's narrow layers stay plain tensors beside DTensors, and on an accelerator
    Adam's default foreach step takes both into one call, which DTensor refuses ("got mixed
    torch.Tensor and DTensor", H200)."""
    cell.skip_unless_runnable(world.device)
    model = cell.parallelise(seeded_wide_and_narrow(wide_layers), world)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, foreach=False)
    model(wide_batch(0).to(world.device)).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer
