"""A model big enough that one extra copy of its state is unmistakable in a memory peak.

Ten wide layers of 4 MiB of weights each (half with rows that divide by neither 2 nor 4, so
their shards are uneven; half with rows that divide, as tensor parallelism needs) and 48
narrow ones (many small tensors): about 40 MiB of parameters, and 120 MiB with Adam's two
moments, per world. A copy of the whole model (40 MiB) is more than twice the transient
buffers the bounds allow a step (four of the largest tensor), so the memory checks tell one
from the other; four ranks hold it beside the rest of the gate in a few hundred MiB each.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from conformance._upstream import tensor_parallel
from conformance.models.common import SEED

WIDTH = 1021  # the model's width, prime
HIDDEN = 1024  # between a pair of wide layers: divides by every tensor-parallel size
NARROW = 17
WIDE_LAYERS = 10
NARROW_LAYERS = 48
BATCH = 4


class WideAndNarrow(nn.Module):
    """Wide layers ``wide.0``, ``wide.2`` .. ``wide.18`` on the input (pairs from the width
    to the hidden size and back, each layer followed by a tanh), narrow layers ``narrow.0`` ..
    ``narrow.47`` on its first columns; the outputs meet in the first columns. Units are
    called as modules, so FSDP's hooks see each. ``wide_layers`` makes it smaller (an even
    count: the layers come in pairs)."""

    units = ("wide", "narrow")

    def __init__(self, wide_layers: int = WIDE_LAYERS) -> None:
        super().__init__()
        if wide_layers % 2:
            raise ValueError(f"wide layers come in pairs; {wide_layers} is odd")
        self.wide_layers = wide_layers
        wide: list[nn.Module] = []
        for layer in range(wide_layers):
            sizes = (WIDTH, HIDDEN) if layer % 2 == 0 else (HIDDEN, WIDTH)
            wide += [nn.Linear(*sizes), nn.Tanh()]
        self.wide = nn.Sequential(*wide)
        self.narrow = nn.Sequential(*(nn.Linear(NARROW, NARROW) for _ in range(NARROW_LAYERS)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wide(x)[..., :NARROW] + self.narrow(x[..., :NARROW])

    def tp_plan(self) -> dict[str, Any]:
        """Wide layers in column- and row-wise pairs (each pair's output replicated); narrow
        layers stay whole."""
        return {
            f"wide.{2 * layer}": tensor_parallel.ColwiseParallel()
            if layer % 2 == 0
            else tensor_parallel.RowwiseParallel()
            for layer in range(self.wide_layers)
        }


def seeded_wide_and_narrow(wide_layers: int = WIDE_LAYERS) -> WideAndNarrow:
    torch.manual_seed(SEED)
    return WideAndNarrow(wide_layers)


def wide_batch(step: int) -> torch.Tensor:
    """The same input on every rank."""
    generator = torch.Generator().manual_seed(SEED + step)
    return torch.randn(BATCH, WIDTH, generator=generator)
