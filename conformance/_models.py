"""Small deterministic models and training steps shared by the conformance tests."""

from __future__ import annotations

from typing import Any

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


class TiedEmbedding(nn.Module):
    """An embedding whose weight the output head shares (one parameter, two FQNs)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 6)
        self.head = nn.Linear(6, 11, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embed(tokens)))


def seeded_tied() -> TiedEmbedding:
    torch.manual_seed(SEED)
    return TiedEmbedding()


def train_tied(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    for step in range(steps):
        tokens = torch.randint(0, 11, (4, 3), generator=torch.Generator().manual_seed(SEED + step))
        optimizer.zero_grad()
        model(tokens).pow(2).mean().backward()
        optimizer.step()


def ground_truth(steps: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The single-process model's state dict and its FQN-keyed optimizer state."""
    model = seeded_mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    train(model, optimizer, steps)
    names = {param: name for name, param in model.named_parameters()}
    state = {names[param]: dict(values) for param, values in optimizer.state.items()}
    return model.state_dict(), state
