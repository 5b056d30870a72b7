"""The load side of ``fsdp_state_dict_utils``: a state dict of any type back into flat shards.

Every rank checks its input first (keys, shapes, kinds of value) and the
ranks agree on the verdict in one collective, so bad input, or keys that
differ between ranks, raise the same error everywhere before any rank
starts gathering or writing.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.fsdp import StateDictType
from torch.distributed.tensor import DTensor

from reference_impl._flat_layout import FlatParamShard
from reference_impl._fqn import Entry
from reference_impl._fsdp1_model import (
    FULL,
    LOCAL,
    SHARDED,
    Fsdp1Model,
    Original,
    Request,
)
from reference_impl._gather import full_tensor_of_dtensor, full_tensor_of_sharded_tensor

StateDict = dict[str, Any]


class IncompatibleKeys(NamedTuple):
    """What a model load left out: keys the model has but the state dict lacked, and the reverse."""

    missing_keys: list[str]
    unexpected_keys: list[str]


@torch.no_grad()
def fsdp_load_state_dict(
    model: nn.Module,
    state_dict: StateDict,
    state_dict_type: StateDictType = FULL,
    *,
    strict: bool = True,
    group: dist.ProcessGroup | None = None,
) -> IncompatibleKeys:
    """Models ``model.load_state_dict(state_dict, strict)`` inside ``FSDP.state_dict_type``.

    FULL takes full values, SHARDED ShardedTensors or DTensors (gathered
    over the shard group), LOCAL each flat shard's ShardedTensor; each rank
    writes its part of every original parameter into its flat shard, and
    zeros into the padding. With ``strict``, missing or unexpected keys
    raise before anything is written. Every rank of ``group`` (the ranks
    the model spans; default: the world) must call it; ``state_dict`` is
    not changed.
    """
    parts = Fsdp1Model(model, Request.of(state_dict_type, None))
    expected = _expected_keys(parts)
    missing = [key for key in expected if key not in state_dict]
    unexpected = [key for key in state_dict if key not in expected]
    problems = [
        p for key, entry in expected.items() for p in _problems(parts, key, entry, state_dict)
    ]
    if strict and (missing or unexpected):
        problems.append(f"missing keys {missing}, unexpected keys {unexpected}")
    _agree_on(problems, sorted(set(expected) & set(state_dict)), group)
    for shard in parts.local_shards():
        key = parts.flat_param_key(shard)
        if key in state_dict:
            _write_local_flat_shard(shard, state_dict[key])
    for entry in parts.entries:
        if entry.key in state_dict:
            _load_entry(parts, entry, state_dict[entry.key])
    return IncompatibleKeys(missing, unexpected)


def _expected_keys(parts: Fsdp1Model) -> dict[str, Entry | FlatParamShard]:
    """Every key the applied types' state dict has, with its entry or LOCAL's flat shard."""
    expected: dict[str, Entry | FlatParamShard] = {}
    for entry in parts.entries:
        original = parts.original_of(entry)
        if (
            original is None
            or parts.request_of(original.shard).state_dict_type != LOCAL
            or original.shard.originals is not None
        ):
            expected[entry.key] = entry
    expected.update({parts.flat_param_key(shard): shard for shard in parts.local_shards()})
    return expected


def _problems(
    parts: Fsdp1Model, key: str, entry: Entry | FlatParamShard, state_dict: StateDict
) -> list[str]:
    """What is wrong with this rank's value for ``key``, naming it; nothing if it is absent."""
    if key not in state_dict:
        return []
    value = state_dict[key]
    if isinstance(entry, FlatParamShard):
        return _local_flat_shard_problems(entry, key, value)
    if entry.value is None:
        return []  # extra state: whatever ``set_extra_state`` takes
    if not isinstance(value, torch.Tensor):
        return [f"{key}: a {type(value).__name__}, not a tensor"]
    original = parts.original_of(entry)
    kind = parts.request_of(original.shard).state_dict_type if original else FULL
    wanted = _wanted_shape(entry, original, kind)
    if tuple(value.shape) != tuple(wanted):
        return [f"{key}: shape {tuple(value.shape)}, the model's is {tuple(wanted)}"]
    if original and kind == SHARDED and not isinstance(value, (ShardedTensor, DTensor)):
        return [f"{key}: a plain tensor where a sharded state dict has shards"]
    return []


def _wanted_shape(entry: Entry, original: Original | None, kind: StateDictType) -> torch.Size:
    if original is None:
        assert entry.value is not None
        return entry.value.shape
    return original.local_slice().shape if kind == LOCAL else original.segment.shape


def _local_flat_shard_problems(shard: FlatParamShard, key: str, value: Any) -> list[str]:
    if not isinstance(value, ShardedTensor):
        return [f"{key}: a {type(value).__name__}, not the ShardedTensor of a local state dict"]
    if tuple(value.shape) != (shard.layout.unsharded_numel,):
        return [
            f"{key}: shape {tuple(value.shape)}, the flat parameter's is "
            f"({shard.layout.unsharded_numel},)"
        ]
    valid = shard.layout.unpadded_shard_numel(shard.shard_rank)
    held = [s.tensor.numel() for s in value.local_shards()]
    if held != ([valid] if valid else []):
        return [f"{key}: local shards of {held} elements; this rank's flat shard has {valid}"]
    return []


def _agree_on(problems: list[str], present: list[str], group: dist.ProcessGroup | None) -> None:
    """Raise the same error on every rank if any rank's input is wrong or holds other keys."""
    everyones: list[Any] = [(problems, present)]
    ranks = [0]
    if dist.is_initialized():
        everyones = [None] * dist.get_world_size(group)
        dist.all_gather_object(everyones, (problems, present), group=group)
        ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
    by_rank = list(zip(ranks, everyones, strict=True))
    report = [f"rank {rank}: {p}" for rank, (found, _) in by_rank for p in found]
    first = set(everyones[0][1])
    for rank, (_, keys) in by_rank:
        differing = sorted(set(keys) ^ first)
        if differing:
            report.append(f"rank {rank}: holds other keys than rank {ranks[0]}: {differing}")
    if report:
        raise RuntimeError("cannot load the FSDP1 state dict: " + "; ".join(report))


def _load_entry(parts: Fsdp1Model, entry: Entry, value: Any) -> None:
    original = parts.original_of(entry)
    if original is None:
        if entry.value is None:
            entry.owner.set_extra_state(value)
        else:
            entry.value.copy_(value)
    elif parts.request_of(original.shard).state_dict_type == LOCAL:
        original.local_slice().copy_(value)
    else:
        _write_original(original, _full_value(value, original.shard))


def _full_value(value: torch.Tensor, shard: FlatParamShard) -> torch.Tensor:
    if isinstance(value, DTensor):
        return full_tensor_of_dtensor(value)
    if isinstance(value, ShardedTensor):
        return full_tensor_of_sharded_tensor(value, group=shard.group)
    return value


def _write_original(original: Original, full: torch.Tensor) -> None:
    """Copy this rank's part of a full original parameter into its flat shard."""
    held = original.shard.layout.slices(original.shard.shard_rank).get(original.segment.fqn)
    if held is not None:
        original.local_slice().copy_(full.reshape(-1)[held.start : held.end])


def _write_local_flat_shard(shard: FlatParamShard, value: ShardedTensor) -> None:
    """This rank's unpadded flat shard from the state dict; the tail padding becomes zeros."""
    valid = shard.layout.unpadded_shard_numel(shard.shard_rank)
    flat = shard.flat_param.detach()
    for piece in value.local_shards():  # one where the rank holds elements, else none
        flat[:valid].copy_(piece.tensor.reshape(-1))
    flat[valid:].zero_()
