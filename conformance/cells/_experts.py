"""Expert parallelism: each rank holds some experts of a mixture alone, as upstream's
``e2e/test_fsdp_ep.py`` and torchtitan's MoE training do.

A model with experts (``experts``, a ``ModuleList``) mixes them through two boundaries:
``to_experts`` before them and ``from_experts`` after. In one process both are identities.
Split over a ``(dp, ep)`` mesh, the ranks of one ``ep`` group each hold their share of the
experts (the others' entries are ``None``, so the rank's state dicts hold its experts'
keys alone, under the model's own names); ``from_experts`` sums the group's partial outputs
(all-reduce) and passes the output's gradient through, and ``to_experts`` passes inputs
through and sums the group's partial input gradients. Every rank then computes the whole
output and every gradient a single process does, bit for bit: with two experts each sum has
two terms, and the graph has the same shape in one process and in the world. The experts are
sharded by FSDP2 over ``dp`` (the ranks that hold the same experts), the rest of the model over
the whole world.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from conformance._upstream import device_mesh, fully_shard_on
from conformance.compare import HELD

EXPERT_GROUP = "expert_group"  # the model's attribute: its ep group, None in one process


class _ToExperts(torch.autograd.Function):
    """Identity forward; backward sums the gradient over the expert group."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        if ctx.group is not None:
            grad = grad.contiguous()
            dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _FromExperts(torch.autograd.Function):
    """Forward sums the partial outputs over the expert group; identity backward (every rank
    computes the same loss from the same output)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        if group is None:
            return tensor.view_as(tensor)
        total = tensor.clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def to_experts(tensor: torch.Tensor, model: nn.Module) -> torch.Tensor:
    """``tensor`` as the experts' input (see the module docstring)."""
    result: torch.Tensor = _ToExperts.apply(tensor, getattr(model, EXPERT_GROUP, None))
    return result


def from_experts(tensor: torch.Tensor, model: nn.Module) -> torch.Tensor:
    """The sum of every expert's output, from this rank's experts' sum ``tensor``."""
    result: torch.Tensor = _FromExperts.apply(tensor, getattr(model, EXPERT_GROUP, None))
    return result


def split_experts(model: nn.Module, world: Any) -> nn.Module:
    """``model``'s experts split over the ``ep`` dimension of a ``(dp, ep)`` mesh, as many
    groups as the model has experts or the world has ranks, whichever is fewer (one: the whole
    model); each expert sharded by FSDP2 over ``dp``, the rest over the whole world."""
    experts: nn.ModuleList | None = getattr(model, "experts", None)
    if experts is None:
        pytest.skip(f"{type(model).__name__} has no experts")
    shard = fully_shard_on(world.device)
    count = len(experts)
    split = min(count, world.size)
    if world.size % split or count % split:
        raise ValueError(f"{count} experts do not split over a world of {world.size} ranks")
    expert_mesh, ep_mesh = _meshes(world, split)
    share = count // split
    first = ep_mesh.get_local_rank() * share
    held = range(first, first + share)
    for index in range(count):
        if index in held:
            shard(experts[index], mesh=expert_mesh)
        else:
            experts._modules[str(index)] = None
    if split > 1:
        shared = [name for name in (*model._modules, *model._buffers) if name != "experts"]
        setattr(model, HELD, (*shared, *(f"experts.{index}" for index in held)))
        setattr(model, EXPERT_GROUP, ep_mesh.get_group())
    shard(model, mesh=world.mesh(world.size, ("world",)))
    return model


def _meshes(world: Any, split: int) -> tuple[Any, Any]:
    """The mesh each of this rank's experts is sharded over (the ranks that hold it) and the
    ``ep`` mesh (the ranks that hold the other experts). Without data parallelism the experts'
    mesh is the rank alone, made from a group only it creates: a world that stands for part of
    another (``conformance/cells/_subworld.py``) makes 1-D meshes alone."""
    data_parallel = world.size // split
    if data_parallel > 1:
        mesh = world.mesh((data_parallel, split), ("dp", "ep"))
        return mesh["dp"], mesh["ep"]
    ep_mesh = world.mesh(split, ("ep",))
    if split == 1:
        return ep_mesh, ep_mesh
    alone = dist.new_group([world.rank], use_local_synchronization=True)
    return device_mesh.DeviceMesh.from_group(
        alone, world.device.type, mesh=[world.rank], mesh_dim_names=("dp",)
    ), ep_mesh
