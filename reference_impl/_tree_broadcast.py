"""A nested state dict that only rank 0 holds, made whole on every rank of a group.

The structure and small values travel as one object; each tensor of one or
more dimensions is then broadcast alone, so no rank holds more than the
result plus one tensor in flight. Zero-dim tensors travel with the structure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from reference_impl._devices import group_device


@dataclass(frozen=True)
class _Pending:
    """Where a broadcast tensor goes, as the other ranks first learn of it."""

    shape: torch.Size
    dtype: torch.dtype


def broadcast_tree(tree: Any, device: torch.device, group: dist.ProcessGroup | None) -> Any:
    """Rank 0's ``tree`` (dicts, lists, tuples of anything picklable) on every rank of ``group``.

    Other ranks' ``tree`` is ignored. Received tensors land on ``device``
    (rank 0's too, as copies); every rank of ``group`` must call it.
    """
    source = dist.get_rank(group) == 0
    holder = [_skeleton(tree) if source else None]
    dist.broadcast_object_list(holder, group=group, group_src=0)
    comm_device = group_device(group, device)
    return _filled(holder[0], tree if source else None, comm_device, device, group)


def _skeleton(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _skeleton(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_skeleton(item) for item in value)
    if isinstance(value, torch.Tensor):
        if value.dim() == 0:
            return value.detach().cpu()
        return _Pending(value.shape, value.dtype)
    return value


def _filled(
    skeleton: Any,
    original: Any,
    comm_device: torch.device,
    device: torch.device,
    group: dist.ProcessGroup | None,
) -> Any:
    """``skeleton`` with each pending tensor received, in the same order on every rank."""
    if isinstance(skeleton, dict):
        return {
            key: _filled(
                item, None if original is None else original[key], comm_device, device, group
            )
            for key, item in skeleton.items()
        }
    if isinstance(skeleton, (list, tuple)):
        items = [
            _filled(item, None if original is None else original[i], comm_device, device, group)
            for i, item in enumerate(skeleton)
        ]
        return type(skeleton)(items)
    if not isinstance(skeleton, _Pending):
        return skeleton
    if original is not None:
        buffer = original.detach().to(comm_device, copy=True)
    else:
        buffer = torch.empty(skeleton.shape, dtype=skeleton.dtype, device=comm_device)
    dist.broadcast(buffer, group=group, group_src=0)
    return buffer.to(device)
