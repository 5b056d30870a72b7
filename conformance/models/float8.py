"""A model trained in float8 by torchao, and one process training it: the float8 checks'
model and truth.

``Float8Linear`` (``torchao.float8.convert_to_float8_training``) keeps fp32 masters and casts
weights, inputs and gradients to float8 with dynamic scales for each matmul. With
``enable_fsdp_float8_all_gather`` FSDP2 gathers the weights already in float8: each rank
casts its shard with the scale of the whole weight. Float8 matmuls need every dimension a
multiple of 16, which the matrix's MLP has not; this MLP has.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest
import torch
from torch import nn

from conformance.models.common import SEED, GroundTruth, train
from conformance.models.optimizers import adam

TORCHAO_FLOAT8 = "torchao.float8"


class Float8ReadyMLP(nn.Module):
    """Two linear layers whose sizes (32 → 64 → 32) float8 matmuls take."""

    units = ("fc1", "fc2")

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def float8_batch(step: int) -> torch.Tensor:
    """The same input on every rank, 16 rows as float8 matmuls take."""
    return torch.randn(16, 32, generator=torch.Generator().manual_seed(SEED + step))


def torchao_float8() -> ModuleType:
    """torchao's float8 training, or a skip naming why this environment lacks it."""
    try:
        return importlib.import_module(TORCHAO_FLOAT8)
    except ImportError as error:
        pytest.skip(f"{TORCHAO_FLOAT8} cannot be imported here: {error}")


def seeded_model(float8_all_gather: bool | None) -> nn.Module:
    """The MLP from its seed, its linear layers converted to float8 training
    (``float8_all_gather``: FSDP2 gathers the weights in float8); None: left in fp32."""
    torch.manual_seed(SEED)
    model = Float8ReadyMLP()
    if float8_all_gather is None:
        return model
    float8 = torchao_float8()
    config = float8.Float8LinearConfig(enable_fsdp_float8_all_gather=float8_all_gather)
    float8.convert_to_float8_training(model, config=config)
    return model


def float8_truth(steps: int) -> GroundTruth:
    """One process's float8 training of the MLP after ``steps`` Adam steps. FSDP2 with or
    without the float8 all-gather must equal it: ranks see the same input, so their gradients
    average to these, and a shard cast with the whole weight's scale is that cast's part."""
    model = seeded_model(float8_all_gather=False)
    optimizer = adam(model)
    train(model, optimizer, steps, inputs=float8_batch)
    return GroundTruth.of(model, optimizer)
