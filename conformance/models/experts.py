"""A mixture of experts: the model the expert-parallel cell (``ep``) trains."""

from __future__ import annotations

import torch
from torch import nn

from conformance.cells import from_experts, to_experts
from conformance.models.common import SEED

HIDDEN = 10
EXPERTS = 2


class MixtureMLP(nn.Module):
    """The matrix's MLP (7 → 10 → 5, its two buffers) with a mixture of two experts between
    its layers: a router weighs each expert's output of the hidden activation, and their sum
    is added to it. Experts are 10 → 10 layers, so every FSDP2 shard is uneven."""

    units = ("fc1", "fc2")  # the submodules a nested wrapping wraps on their own

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(7, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, 5)
        self.router = nn.Linear(HIDDEN, EXPERTS, bias=False)
        self.experts = nn.ModuleList(nn.Linear(HIDDEN, HIDDEN) for _ in range(EXPERTS))
        self.register_buffer("running_scale", torch.linspace(0.5, 1.5, HIDDEN))
        self.register_buffer("scratch", torch.zeros(3), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.fc1(x)) * self.running_scale
        weights = to_experts(torch.softmax(self.router(hidden), dim=-1), self)
        inputs = to_experts(hidden, self)
        mixed: torch.Tensor | None = None
        for index, expert in enumerate(self.experts):
            if expert is None:  # another rank's expert
                continue
            part = weights[:, index : index + 1] * expert(inputs)
            mixed = part if mixed is None else mixed + part
        assert mixed is not None, "a rank holds at least one expert"
        return self.fc2(hidden + from_experts(mixed, self))


def seeded_mixture() -> MixtureMLP:
    """The same initial weights on every rank and in the single-process ground truth."""
    torch.manual_seed(SEED)
    return MixtureMLP()
