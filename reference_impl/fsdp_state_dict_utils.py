"""Models ``torch/distributed/fsdp/_state_dict_utils.py``: FSDP1's three model state-dict types.

An FSDP1 model's state dict under each ``StateDictType``, computed from the
flat parameters' layout (``reference_impl._flat_layout``) with public
collectives, never through FSDP1's own state-dict hooks:

- FULL_STATE_DICT: each original parameter gathered over its shard group
  and copied; ``rank0_only`` leaves FSDP1's parameters and buffers out on
  the other ranks (they still join the gathers); ``offload_to_cpu`` moves
  parameters and buffers to the CPU.
- SHARDED_STATE_DICT: each original parameter chunked along dim 0 over the
  shard group: a ShardedTensor, or a DTensor where FSDP1 was given a device
  mesh (``reference_impl._fsdp_chunks``).
- LOCAL_STATE_DICT: each flat parameter's own shard without its tail
  padding, as a 1-D ShardedTensor under ``<module>._flat_param`` that shares
  the shard's storage; under ``use_orig_params`` also each original
  parameter's flattened slice of that shard.

A ``NO_SHARD`` module gives FULL_STATE_DICT with the default config whatever
type is asked for (FSDP1 warns that it does). ``rank0_only`` gives ranks
other than global rank 0 nothing of FSDP1's: no parameters, no buffers.

FULL and SHARDED give buffers back in the dtype they had before mixed
precision cast them. Parameters of ignored modules and extra state are
taken as they are. Keys are the model's state-dict keys without FSDP1's and
activation checkpointing's wrapper segments. ``fsdp_load_state_dict``
inverts each type, writing into every rank's flat shard; it checks the
input on every rank and agrees on the verdict first, so bad input raises
the same error everywhere instead of leaving a rank in a collective.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.fsdp import StateDictConfig, StateDictType

from reference_impl._flat_layout import FlatParamShard
from reference_impl._fqn import Entry
from reference_impl._fsdp1_model import (
    FULL,
    LOCAL,
    Fsdp1Model,
    Original,
    Request,
)
from reference_impl._fsdp_chunks import (
    chunk_like_fsdp,
    gathered_placements,
    sharded_tensor_of_row_chunks,
)
from reference_impl._fsdp_model_load import IncompatibleKeys, fsdp_load_state_dict

__all__ = ["IncompatibleKeys", "fsdp_load_state_dict", "fsdp_state_dict"]

StateDict = dict[str, Any]


@torch.no_grad()
def fsdp_state_dict(
    model: nn.Module,
    state_dict_type: StateDictType = FULL,
    config: StateDictConfig | None = None,
) -> StateDict:
    """Models ``model.state_dict()`` inside ``FSDP.state_dict_type(model, type, config)``.

    ``config`` is the type's own config class (its defaults when None). Every
    rank must call it: FULL and SHARDED gather each flat parameter over its
    shard group. LOCAL refuses modules given a device mesh, as FSDP1 does.
    """
    parts = Fsdp1Model(model, Request.of(state_dict_type, config))
    full_flats = {
        # FSDP1 unshards on the compute device, bringing offloaded parameters there first.
        id(shard): shard.unsharded(shard.flat_param.detach().to(shard.compute_device))
        for shard in parts.shards
        if parts.request_of(shard).state_dict_type != LOCAL
    }
    rank = dist.get_rank() if dist.is_initialized() else 0
    state: StateDict = {}
    for entry in parts.entries:
        original = parts.original_of(entry)
        if original is not None:
            request = parts.request_of(original.shard)
            if not (request.rank0_only and rank != 0):
                value = _saved_original(original, request, full_flats.get(id(original.shard)))
                if value is not None:
                    state[entry.key] = value
        elif parts.is_buffer(entry):
            dropped = parts.buffer_request.rank0_only and rank != 0
            if not (dropped and id(entry.value) in parts.fsdp_buffers):
                state[entry.key] = _saved_buffer(parts, entry)
        else:
            state[entry.key] = _as_is(entry)
    for shard in parts.local_shards():
        value = _local_flat_shard(shard)
        state[parts.flat_param_key(shard)] = _offloaded(value, parts.request_of(shard))
    return state


def _saved_original(original: Original, request: Request, flat: torch.Tensor | None) -> Any:
    """An original parameter as the type saves it; None where LOCAL keeps only the flat shard."""
    if request.state_dict_type == LOCAL:
        return original.local_slice() if original.shard.originals is not None else None
    assert flat is not None
    segment = original.segment
    full = flat[segment.start : segment.end].view(segment.shape)
    if request.state_dict_type == FULL:
        return _offloaded(full.clone(), request)
    mesh = original.shard.mesh
    if request.config._use_dtensor and mesh is None:
        raise ValueError(
            f"{original.shard.canonical(segment.fqn)}: DTensors need an FSDP1 module given a mesh"
        )
    return _offloaded(chunk_like_fsdp(full, original.shard.group, mesh), request)


def _offloaded(value: Any, request: Request) -> Any:
    return value.cpu() if request.config.offload_to_cpu else value


def _saved_buffer(parts: Fsdp1Model, entry: Entry) -> torch.Tensor:
    """A buffer as saved: LOCAL as it is; else in its pre-mixed-precision dtype, maybe offloaded.

    On a model not used yet it is first cast as its first use casts it.
    """
    assert entry.value is not None
    value = entry.value.detach()
    first_use_dtype = parts.first_use_dtypes.get(entry.fqn)
    if first_use_dtype is not None:
        value = value.to(first_use_dtype)
    request = parts.buffer_request
    if request.state_dict_type == LOCAL:
        return value
    dtype = parts.original_dtypes.get(entry.fqn)
    if dtype is not None:
        value = value.to(dtype).clone()
    return value.cpu() if request.config.offload_to_cpu else value


def _as_is(entry: Entry) -> Any:
    """State FSDP1 does not manage, taken as it is: extra state, ignored modules' parameters."""
    if entry.value is None:
        return entry.owner.get_extra_state()
    return entry.value.detach()


def _local_flat_shard(shard: FlatParamShard) -> ShardedTensor:
    """The flat shard without tail padding: a 1-D ShardedTensor over the unpadded flat parameter.

    The local piece is a view of the flat parameter, as FSDP1's is (it keeps
    ``requires_grad``, which the metadata records); each piece is placed where its rank
    holds it, learnt from the shard group as FSDP1's ``init_from_local_shards`` learns it.
    """
    layout = shard.layout
    sizes = [layout.unpadded_shard_numel(r) for r in range(layout.shard_count)]
    chunks = [(r * layout.shard_numel, size) for r, size in enumerate(sizes) if size > 0]
    valid = sizes[shard.shard_rank]
    local = shard.flat_param[:valid] if valid > 0 else None
    size = torch.Size([layout.unsharded_numel])
    placements = gathered_placements(local, shard.group)
    return sharded_tensor_of_row_chunks(
        local, chunks, size, shard.flat_param, shard.group, placements
    )
