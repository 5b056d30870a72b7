"""Small deterministic models and training steps shared by the conformance tests."""

from __future__ import annotations

import torch
from torch import nn

SEED = 1234


class MLPWithBuffers(nn.Module):
    """Two linear layers, a persistent buffer and a non-persistent one.

    Sizes (7 → 10 → 5) do not divide by 2 or 4, so every sharding is uneven.
    """

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(7, 10)
        self.fc2 = nn.Linear(10, 5)
        self.register_buffer("running_scale", torch.linspace(0.5, 1.5, 10))
        self.register_buffer("scratch", torch.zeros(3), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)) * self.running_scale)


def seeded_mlp() -> MLPWithBuffers:
    """The same initial weights on every rank and in the single-process ground truth."""
    torch.manual_seed(SEED)
    return MLPWithBuffers()


def batch(step: int) -> torch.Tensor:
    """The same input on every rank: gradients average to the single-process ones."""
    generator = torch.Generator().manual_seed(SEED + step)
    return torch.randn(8, 7, generator=generator)


def train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    for step in range(steps):
        optimizer.zero_grad()
        model(batch(step)).pow(2).mean().backward()
        optimizer.step()
