"""Pipeline stages: each rank holds only its stage's layers, as pipeline-parallel training does.

A model that can be split names its stages in order (``stages``: the submodules and buffers
each holds) and runs one of them at a time (``stage_forward(stage, x)``). On the ranks of
stage ``s`` the other stages' submodules and buffers are removed (set to ``None``, as
torchtitan's stage split does), so the rank's state dicts hold its stage's keys alone, under
the model's own names. The model's ``forward`` then runs the whole pipeline: each stage
sends its activation to the next and receives the gradient back, and the last stage sends
its output to every earlier one, so every rank returns the model's output and a training
step (``model(x)``, a loss, ``backward``, ``step``) is the one a single process takes.
Where the world holds more ranks than stages, each stage's ranks are data-parallel
(composable ``replicate`` over the ``dp`` dimension of a ``(pp, dp)`` mesh).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from conformance._upstream import composable
from conformance.compare import HELD

_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
_MAX_DIMS = 6


@dataclass(frozen=True)
class _Link:
    """This rank's stage and the global rank of each stage of its pipeline."""

    stage: int
    ranks: tuple[int, ...]

    @property
    def last(self) -> int:
        return len(self.ranks) - 1

    def send(self, tensor: torch.Tensor, stage: int) -> None:
        """``tensor`` to ``stage``: its dtype, whether it requires grad and its shape first,
        then its values."""
        header = torch.zeros(_MAX_DIMS + 3, dtype=torch.int64, device=tensor.device)
        header[0] = _DTYPES.index(tensor.dtype)
        header[1] = int(tensor.requires_grad)
        header[2] = tensor.dim()
        header[3 : 3 + tensor.dim()] = torch.tensor(tensor.shape)
        dist.send(header, dst=self.ranks[stage])
        dist.send(tensor.detach().contiguous(), dst=self.ranks[stage])

    def recv(self, stage: int, device: torch.device) -> torch.Tensor:
        """The next tensor ``stage`` sends this rank, requiring grad where the sent one did."""
        header = torch.empty(_MAX_DIMS + 3, dtype=torch.int64, device=device)
        dist.recv(header, src=self.ranks[stage])
        dims = int(header[2])
        shape = [int(size) for size in header[3 : 3 + dims]]
        tensor = torch.empty(shape, dtype=_DTYPES[int(header[0])], device=device)
        dist.recv(tensor, src=self.ranks[stage])
        return tensor.requires_grad_(bool(header[1]))


class _HandOn(torch.autograd.Function):
    """A stage before the last: sends its activation on and returns the model's output from
    the last stage; backward receives the activation's gradient from the next stage where
    the activation requires one. ``anchor``, an empty tensor requiring grad, keeps the
    output in the graph when nothing before it trains (a frozen first stage), so that every
    rank's loss can be backpropagated."""

    @staticmethod
    def forward(
        ctx: Any, activation: torch.Tensor, anchor: torch.Tensor, link: _Link
    ) -> torch.Tensor:
        ctx.link, ctx.device = link, activation.device
        link.send(activation, link.stage + 1)
        return link.recv(link.last, activation.device).detach()

    @staticmethod
    def backward(ctx: Any, _: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        # The last stage computes the loss's gradient itself, from the same output.
        if not ctx.needs_input_grad[0]:
            return None, None, None
        return ctx.link.recv(ctx.link.stage + 1, ctx.device), None, None


def _received(link: _Link, device: torch.device) -> torch.Tensor:
    """The previous stage's activation, whose gradient goes back to it in backward where it
    requires one."""
    activation = link.recv(link.stage - 1, device)
    if activation.requires_grad:
        activation.register_hook(lambda grad: link.send(grad, link.stage - 1))
    return activation


def _pipelined_forward(model: nn.Module, link: _Link) -> Callable[[torch.Tensor], torch.Tensor]:
    def forward(x: torch.Tensor) -> torch.Tensor:
        activation = x if link.stage == 0 else _received(link, x.device)
        output = model.stage_forward(link.stage, activation)
        if link.stage < link.last:
            anchor = torch.empty(0, device=x.device, requires_grad=torch.is_grad_enabled())
            return _HandOn.apply(output, anchor, link)
        for stage in range(link.last):
            link.send(output.detach(), stage)
        return output

    return forward


def _drop(model: nn.Module, name: str) -> None:
    """Remove a submodule or buffer of another stage: the name stays, holding ``None``."""
    if name in model._modules:
        model._modules[name] = None
    elif name in model._buffers:
        model._buffers[name] = None
    else:
        raise ValueError(f"{type(model).__name__} has no submodule or buffer {name!r} to drop")


def split_into_stages(model: nn.Module, world: Any) -> nn.Module:
    """``model`` as this rank's pipeline stage (module docstring): as many stages as the model
    has, or as the world has ranks, whichever is fewer; at one stage the model is whole."""
    plan: tuple[tuple[str, ...], ...] | None = getattr(model, "stages", None)
    if plan is None:
        pytest.skip(f"{type(model).__name__} has no pipeline stages")
    count = min(len(plan), world.size)
    if world.size % count:
        raise ValueError(f"{count} stages do not divide a world of {world.size} ranks")
    if count == 1:
        return model
    if len(plan) % count:
        raise ValueError(f"{len(plan)} pipeline parts do not split into {count} stages")
    per = len(plan) // count
    groups = [
        tuple(name for part in plan[i * per : (i + 1) * per] for name in part) for i in range(count)
    ]
    data_parallel = world.size // count
    mesh = world.mesh((count, data_parallel), ("pp", "dp")) if data_parallel > 1 else None
    stages = mesh["pp"] if mesh is not None else world.mesh(count, ("pp",))
    stage = stages.get_local_rank()
    for other, names in enumerate(groups):
        if other != stage:
            for name in names:
                _drop(model, name)
    setattr(model, HELD, groups[stage])
    if mesh is not None:
        for name in groups[stage]:
            module = model._modules.get(name)
            if module is not None and any(p.requires_grad for p in module.parameters()):
                composable.replicate(module, device_mesh=mesh["dp"])
    ranks = tuple(dist.get_process_group_ranks(stages.get_group()))
    model.forward = _pipelined_forward(model, _Link(stage, ranks))  # type: ignore[method-assign]
    return model
