"""Training trajectories: what a rank holds after each step, and where two runs part.

A snapshot is everything training depends on, in this rank's own memory: each parameter's
local values and gradient, each buffer, the optimizer's state and hyper-parameters, the
scheduler's state. Two runs that should be the same are compared snapshot by snapshot, bit
for bit, and the first difference is named by step, key and values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from conformance._upstream import dtensor, sharded_tensor
from conformance.cells import PARALLELISMS, Parallelism
from conformance.models.common import seeded_mlp, train
from conformance.models.optimizers import OPTIMIZERS, adam
from conformance.models.zoo import MODELS, model_of

Snapshot = dict[str, Any]
Scheduler = torch.optim.lr_scheduler.LRScheduler
Training = tuple[nn.Module, torch.optim.Optimizer, Scheduler | None]
VALUES_SHOWN = 6


def _local(value: Any) -> Any:
    if isinstance(value, dtensor.DTensor):
        value = value.to_local()
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    return value


def _optimizer_items(
    model: nn.Module, optimizer: torch.optim.Optimizer
) -> Iterator[tuple[str, Any]]:
    names = {param: name for name, param in model.named_parameters()}
    for param, values in optimizer.state.items():
        for key, value in values.items():
            yield f"optimizer.state.{names.get(param, '<unnamed>')}.{key}", value
    for index, group in enumerate(optimizer.param_groups):
        yield f"optimizer.param_groups.{index}.params", [names.get(p) for p in group["params"]]
        for key, value in group.items():
            if key != "params":
                yield f"optimizer.param_groups.{index}.{key}", value


def snapshot(
    model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Scheduler | None
) -> Snapshot:
    """This rank's training state, copied."""
    taken: Snapshot = {}
    for name, param in model.named_parameters():
        taken[f"model.{name}"] = _local(param)
        taken[f"grad.{name}"] = _local(param.grad)
    for name, buffer in model.named_buffers():
        taken[f"buffer.{name}"] = _local(buffer)
    for key, value in _optimizer_items(model, optimizer):
        taken[key] = _local(value)
    if scheduler is not None:
        for key, value in scheduler.state_dict().items():
            taken[f"scheduler.{key}"] = _local(value)
    return taken


def tree_leaves(tree: Any, path: str = "") -> Snapshot:
    """A state dict as its leaves by key path, copied: each container's type under its own
    path, a DTensor's placements and local values, a ShardedTensor's shard offsets and local
    values. Two trees are the same when their leaves are (``differences``)."""
    leaves: Snapshot = {f"{path}<type>": type(tree).__name__}
    if isinstance(tree, dict):
        leaves[f"{path}<keys>"] = [str(key) for key in tree]
        for key, value in tree.items():
            leaves.update(tree_leaves(value, f"{path}.{key}" if path else str(key)))
    elif isinstance(tree, (list, tuple)):
        for index, value in enumerate(tree):
            leaves.update(tree_leaves(value, f"{path}[{index}]"))
    elif isinstance(tree, dtensor.DTensor):
        leaves[f"{path}<placements>"] = str(tuple(tree.placements))
        leaves[path] = _local(tree)
    elif isinstance(tree, sharded_tensor.ShardedTensor):
        for shard in tree.local_shards():
            offsets = shard.metadata.shard_offsets
            leaves[f"{path}<shard at {offsets}>"] = _local(shard.tensor)
    else:
        leaves[path] = _local(tree)
    return leaves


def _shown(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        flat = value.reshape(-1)[:VALUES_SHOWN].tolist()
        more = ", ..." if value.numel() > VALUES_SHOWN else ""
        return f"{value.dtype} {list(value.shape)} {flat}{more}"
    return repr(value)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool(torch.equal(_bits(a), _bits(b)))
        )
    return bool(a == b)


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes: equal where the values are bit for bit, so a NaN equals itself (a
    load that leaves a NaN as it was changed nothing) and -0.0 differs from 0.0."""
    return tensor.detach().reshape(-1).contiguous().view(torch.uint8)


def differing_keys(actual: Snapshot, expected: Snapshot) -> list[str]:
    """Every key where two snapshots differ (absent on one side, or not bit-identical)."""
    return [
        key
        for key in sorted(set(actual) | set(expected))
        if key not in actual or key not in expected or not _same(actual[key], expected[key])
    ]


def _shown_at(snapshot: Snapshot, key: str) -> str:
    return _shown(snapshot[key]) if key in snapshot else "absent"


def differences(
    actual: Snapshot, expected: Snapshot, labels: tuple[str, str], limit: int = 3
) -> list[str]:
    """The first ``limit`` keys where two snapshots differ, each with both values; empty when
    they are bit-identical. ``labels`` name the two sides in the messages."""
    return [
        f"{key}: {_shown_at(actual, key)} {labels[0]}, {_shown_at(expected, key)} {labels[1]}"
        for key in differing_keys(actual, expected)[:limit]
    ]


def first_parting(
    actual: list[Snapshot], expected: list[Snapshot], labels: tuple[str, str]
) -> str | None:
    """Where two trajectories first part: the step, the key and both values."""
    for step, (a, b) in enumerate(zip(actual, expected, strict=True)):
        found = differences(a, b, labels, limit=1)
        if found:
            return f"after step {step + 1}: {found[0]}"
    return None


Hook = Callable[[str], None]  # called with a moment's name at each moment of a run
BEFORE_FIRST_STEP, BETWEEN_STEPS, AFTER_ZERO_GRAD = (
    "before the first step",
    "between steps",
    "after a zero_grad",
)


def train_observed(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Scheduler | None,
    steps: int,
    at_moment: Hook,
    inputs: Callable[[int], torch.Tensor],
) -> list[Snapshot]:
    """``steps`` training steps, calling ``at_moment`` before the first, after the first
    (between steps) and after the last step's ``zero_grad``; a snapshot after each step."""
    device = next(model.parameters()).device
    taken = []
    at_moment(BEFORE_FIRST_STEP)
    for step in range(steps):
        optimizer.zero_grad()
        if step == steps - 1:
            at_moment(AFTER_ZERO_GRAD)
        model(inputs(step).to(device)).pow(2).mean().backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        taken.append(snapshot(model, optimizer, scheduler))
        if step == 0:
            at_moment(BETWEEN_STEPS)
    return taken


def model_and_adam(name: str, world: Any) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The MLP on one process (``single``), or the model of the cell ``name``, wrapped; with
    Adam: the objects DCP round trips save and load, and their partners at any size."""
    model = seeded_mlp() if name == "single" else model_of(PARALLELISMS[name], world)
    return model, adam(model)


def fresh_training(
    cell: Parallelism, world: Any, recipe: str, model_id: str | None = None
) -> Training:
    """The zoo's ``model_id`` (by default the cell's own) fresh from its seed, wrapped by
    ``cell``, with ``recipe``'s optimizer and scheduler."""
    model = MODELS[model_id or cell.model_id].make(cell, world)
    optimizer, scheduler = OPTIMIZERS[recipe].build(model)
    return model, optimizer, scheduler


def trained(cell: Parallelism, world: Any, recipe: str, steps: int) -> Training:
    """Fresh objects of ``cell`` (``fresh_training``'s model) trained ``steps`` steps, the
    scheduler stepping with them: the state a check saves or reads."""
    model, optimizer, scheduler = training = fresh_training(cell, world, recipe)
    train(model, optimizer, steps, scheduler)
    return training


def unobserved(_: str) -> None:
    """The hook of a run that does nothing at its moments."""


# Each rank's plain trajectories: deterministic, so computed once per rank process.
_PLAIN: dict[tuple[str, int, str, str, int], list[Snapshot]] = {}


def plain_trajectory(
    cell: Parallelism, world: Any, recipe: str, steps: int, model_id: str | None = None
) -> list[Snapshot]:
    """This rank's snapshots of ``steps`` steps of fresh training of the zoo's ``model_id``
    (by default the cell's own), nothing else done."""
    model_id = model_id or cell.model_id
    key = (cell.name, world.size, recipe, model_id, steps)
    if key not in _PLAIN:
        model, optimizer, scheduler = fresh_training(cell, world, recipe, model_id)
        inputs = MODELS[model_id].inputs
        _PLAIN[key] = train_observed(model, optimizer, scheduler, steps, unobserved, inputs)
    return _PLAIN[key]
