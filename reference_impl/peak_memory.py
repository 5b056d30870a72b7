"""The memory each state-dict utility may take, from the contract and the tensors' sizes.

Upstream's ``_state_dict_utils`` moves state dicts one tensor at a time so that no rank holds
a model twice (the comments of ``_broadcast_state_dict``: "Broadcast every tensor to avoid
OOM"; its maintainers' bound in pytorch#149640: the whole state dict on rank 0, the rank's
shard elsewhere, plus transient buffers). Each function here states, for one rank and one
call, what the call's result may add to the rank's memory and what one step of it may hold
beside that. Both are computed from the sizes and placements of the tensors alone, never
from a measurement: a build whose peak exceeds ``result + transient + slack`` holds more than
its contract allows.

Bytes are counted where they live: ``host`` for CPU tensors, ``device`` for accelerator
tensors; a CPU world has host bytes only. "Full" bytes are a tensor's global size (a DTensor's
or ShardedTensor's whole tensor), "local" bytes the part a rank holds.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import torch
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.tensor import DTensor

# One tensor at a time: a step of a gather, a broadcast or a distribution holds one full
# tensor in the buffer it receives into and one assembled from it (unpadded, redistributed or
# sliced; a padded copy of the local piece is smaller than either). The collective may not
# yet have released the previous step's buffers when the next step allocates its own, so
# two steps' worth: four of the largest full tensor.
TRANSIENT_FULL_TENSORS: Final = 4
# FSDP1 unshards a whole wrapped unit at once: the unit's full flat state, and beside it the
# collective's receive buffer of the same size (gloo gathers into one and copies out).
TRANSIENT_UNITS: Final = 2


@dataclass(frozen=True)
class Footprint:
    """Bytes on the host and on the accelerator."""

    host: int = 0
    device: int = 0

    def __add__(self, other: Footprint) -> Footprint:
        return Footprint(self.host + other.host, self.device + other.device)

    @property
    def total(self) -> int:
        return self.host + self.device


@dataclass(frozen=True)
class PeakBound:
    """The most one rank may hold during ``operation`` over what it held before: ``result``
    (what the call returns or stores that did not exist before) plus ``transient`` (what
    one step may hold beside it). ``largest_tensor`` and ``whole_state_dict`` (full bytes)
    let a reader see at once whether a failing peak held one extra tensor or one extra
    state dict."""

    operation: str
    result: Footprint
    transient: Footprint
    largest_tensor: int
    whole_state_dict: int

    def limit(self, slack: int, *, separate_device: bool) -> Footprint:
        """The bound with ``slack`` bytes for allocators and collectives added to each
        kind of memory; with ``separate_device`` False (a CPU world) device bytes count as
        host bytes."""
        held = self.result + self.transient
        if not separate_device:
            return Footprint(held.total + slack, 0)
        return Footprint(held.host + slack, held.device + slack)


def _itemsize(value: torch.Tensor) -> int:
    return int(torch.empty((), dtype=value.dtype).element_size())


def full_bytes(value: torch.Tensor) -> int:
    """Bytes of ``value``'s whole tensor: a DTensor's or ShardedTensor's global size."""
    return int(torch.Size(value.size()).numel()) * _itemsize(value)


def local_bytes(value: torch.Tensor) -> int:
    """Bytes of the part of ``value`` this rank holds."""
    if isinstance(value, DTensor):
        return int(value.to_local().numel()) * _itemsize(value)
    if isinstance(value, ShardedTensor):
        return sum(int(shard.tensor.numel()) for shard in value.local_shards()) * _itemsize(value)
    return int(value.numel()) * _itemsize(value)


def _on_host(value: torch.Tensor) -> bool:
    if isinstance(value, ShardedTensor):
        shards = value.local_shards()
        return not shards or shards[0].tensor.device.type == "cpu"
    return value.device.type == "cpu"


def _on(value: torch.Tensor, size: int, *, host: bool | None = None) -> Footprint:
    """``size`` bytes where ``value`` lives (or on the host where ``host`` says so)."""
    if host is None:
        host = _on_host(value)
    return Footprint(host=size) if host else Footprint(device=size)


def _tensors(tree: Any) -> Iterator[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, Mapping):
        for value in tree.values():
            yield from _tensors(value)
    elif isinstance(tree, (list, tuple)):
        for value in tree:
            yield from _tensors(value)


def _local_copies(tree: Any) -> Footprint:
    """A new copy of each of this rank's pieces of ``tree``'s tensors, where they live."""
    copies = Footprint()
    for value in _tensors(tree):
        copies += _on(value, local_bytes(value))
    return copies


def _is_distributed(value: torch.Tensor) -> bool:
    return isinstance(value, (DTensor, ShardedTensor))


def _bound(operation: str, tree: Any, result: Footprint, transient: Footprint) -> PeakBound:
    sizes = [full_bytes(value) for value in _tensors(tree)]
    return PeakBound(operation, result, transient, max(sizes, default=0), sum(sizes))


def _keeps(rank: int, ranks_only: Collection[int]) -> bool:
    return not ranks_only or rank in ranks_only


def _largest_step(tensors: Sequence[torch.Tensor], *, host: bool | None = None) -> Footprint:
    """``TRANSIENT_FULL_TENSORS`` of the largest full tensor among ``tensors``."""
    largest = max(tensors, key=full_bytes, default=None)
    if largest is None:
        return Footprint()
    return _on(largest, TRANSIENT_FULL_TENSORS * full_bytes(largest), host=host)


def gather_state_dict_peak(
    state_dict: Any, *, rank: int, ranks_only: Collection[int] = (), cpu_offload: bool = False
) -> PeakBound:
    """Bounds ``_gather_state_dict``: a rank that keeps the result holds every DTensor and
    ShardedTensor whole (on the host with ``cpu_offload``); tensors that are not distributed
    are returned as they are (offloaded: copied to the host unless already there). Every
    rank gathers one tensor at a time, kept or not."""
    tensors = list(_tensors(state_dict))
    distributed = [value for value in tensors if _is_distributed(value)]
    result = Footprint()
    if _keeps(rank, ranks_only):
        for value in distributed:
            result += _on(value, full_bytes(value), host=True if cpu_offload else None)
        if cpu_offload:
            for value in tensors:
                if not _is_distributed(value) and not _on_host(value):
                    result += Footprint(host=local_bytes(value))
    transient = _largest_step(distributed)
    return _bound("_gather_state_dict", state_dict, result, transient)


def offload_state_dict_to_cpu_peak(
    state_dict: Any, *, rank: int, ranks_only: Collection[int] = ()
) -> PeakBound:
    """Bounds ``_offload_state_dict_to_cpu``: a rank that keeps the result holds a host copy
    of each tensor not on the host already; a tensor on the host is returned as it is."""
    result = Footprint()
    if _keeps(rank, ranks_only):
        for value in _tensors(state_dict):
            if not _on_host(value):
                result += Footprint(host=local_bytes(value))
    return _bound("_offload_state_dict_to_cpu", state_dict, result, Footprint())


def create_cpu_state_dict_peak(state_dict: Any) -> PeakBound:
    """Bounds ``_create_cpu_state_dict``: one new host tensor of each tensor's local size
    (pinned or shared memory alike), nothing more."""
    result = Footprint(host=sum(local_bytes(value) for value in _tensors(state_dict)))
    return _bound("_create_cpu_state_dict", state_dict, result, Footprint())


def copy_state_dict_peak(state_dict: Any) -> PeakBound:
    """Bounds ``_copy_state_dict``: it copies into the companion's existing tensors and
    allocates nothing of a tensor's size."""
    return _bound("_copy_state_dict", state_dict, Footprint(), Footprint())


def broadcast_state_dict_peak(
    local_state_dict: Mapping[str, Any], device: torch.device
) -> PeakBound:
    """Bounds ``_broadcast_state_dict`` into ``local_state_dict`` (the same on every rank):
    a DTensor receives its piece in place (a meta DTensor a new local piece on ``device``);
    any other tensor is replaced by the full tensor received, on ``device``. One tensor is
    in flight at a time."""
    host = device.type == "cpu"
    result = Footprint()
    for value in local_state_dict.values():
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            continue
        if isinstance(value, DTensor):
            if value.is_meta:
                result += _on(value, local_bytes(value), host=host)
        else:
            result += _on(value, full_bytes(value), host=host)
    tensors = [v for v in local_state_dict.values() if isinstance(v, torch.Tensor)]
    transient = _largest_step(tensors, host=host)
    return _bound("_broadcast_state_dict", local_state_dict, result, transient)


def distribute_state_dict_peak(
    local_state_dict: Mapping[str, Any], device: torch.device
) -> PeakBound:
    """Bounds ``_distribute_state_dict`` (every rank holds the full dict already): a DTensor
    is replaced by a new one holding this rank's piece on ``device``; any other tensor by
    the full tensor, which on its own device is the full dict's tensor itself. One tensor
    at a time."""
    host = device.type == "cpu"
    dtensors = [v for v in local_state_dict.values() if isinstance(v, DTensor)]
    result = Footprint()
    for value in dtensors:
        result += _on(value, local_bytes(value), host=host)
    transient = _largest_step(dtensors, host=host)
    return _bound("_distribute_state_dict", local_state_dict, result, transient)


def unsharded_unit_bytes(unit_state: Any) -> int:
    """Full bytes of one wrapped unit's state (its parameters, or its optimizer's tensor
    states): what FSDP1 unshards at once to build or load any state dict of that unit.
    Scalars (Adam's ``step``) are kept whole, never gathered, and not counted."""
    return sum(full_bytes(value) for value in _tensors(unit_state) if value.dim() > 0)


def _unit(state: Any, unit_bytes: int | None) -> Footprint:
    """``TRANSIENT_UNITS`` of a unit's full state, where the unit lives: with its largest
    tensor (an optimizer state's first tensor may be Adam's ``step``, on the host while the
    parameters and their moments are on the device)."""
    largest = max(_tensors(state), key=full_bytes, default=None)
    if not unit_bytes or largest is None:
        return Footprint()
    return _on(largest, TRANSIENT_UNITS * unit_bytes)


def get_state_dict_peak(
    state: Any,
    *,
    rank: int,
    full_state_dict: bool,
    cpu_offload: bool,
    fsdp1_unit_bytes: int | None = None,
) -> PeakBound:
    """Bounds ``get_model_state_dict`` / ``get_optimizer_state_dict`` where ``state`` is
    what the model or optimizer holds (its sharded state dict): a full state dict is
    ``state`` gathered, kept on rank 0 alone and on the host with ``cpu_offload``;
    ``cpu_offload`` alone offloads it on every rank; with neither, the call returns the
    tensors already held. FSDP1 (``fsdp1_unit_bytes`` given: its largest unit's
    ``unsharded_unit_bytes``) builds each state dict anew from one unit unsharded at a
    time: its sharded dicts are new copies of the local pieces, and the unit's full state
    may be held beside the result."""
    result = transient = Footprint()
    if full_state_dict:
        ranks_only = (0,) if cpu_offload else ()
        gathered = gather_state_dict_peak(
            state, rank=rank, ranks_only=ranks_only, cpu_offload=cpu_offload
        )
        result, transient = gathered.result, gathered.transient
    elif cpu_offload:
        result = offload_state_dict_to_cpu_peak(state, rank=rank).result
    if fsdp1_unit_bytes is not None and not full_state_dict:
        result += _local_copies(state)
    name = f"get_state_dict(full_state_dict={full_state_dict}, cpu_offload={cpu_offload})"
    return _bound(name, state, result, transient + _unit(state, fsdp1_unit_bytes))


def set_state_dict_peak(
    targets: Any, *, device: torch.device, fsdp1_unit_bytes: int | None = None
) -> PeakBound:
    """Bounds ``set_model_state_dict`` / ``set_optimizer_state_dict`` from a full state
    dict (on every rank, or broadcast from rank 0) into a model or optimizer holding
    ``targets`` (its sharded state dict): each target receives a new tensor on ``device``
    before the old one is let go, of the target's local size (a DTensor's piece, a tensor
    that is not distributed whole), one tensor in flight at a time. FSDP1 receives every
    tensor whole and then loads one unit at a time, unsharded (``TRANSIENT_UNITS`` of it),
    beside that."""
    host = device.type == "cpu"
    size_of = full_bytes if fsdp1_unit_bytes is not None else local_bytes
    tensors = [value for value in _tensors(targets) if value.dim() > 0]
    result = Footprint()
    for value in tensors:
        result += _on(value, size_of(value), host=host)
    transient = _largest_step(tensors, host=host) + _unit(targets, fsdp1_unit_bytes)
    return _bound("set_state_dict", targets, result, transient)


# DCP moves one stored item (a tensor, or a rank's piece of one) at a time. Saving, a step
# holds the item staged for writing (copied to the host, or made whole where it is a view of
# a larger storage); loading, the item as read from the file and as decoded, before it is
# copied into its target: two of the item. The previous step's may not yet be released when
# the next allocates, so two steps' worth, as for the collectives: four of the largest.
ITEMS_IN_FLIGHT: Final = 4
# DCP plans every item it stores (a tensor piece, or a value pickled whole): write and read
# items, their chunk metadata, the plans gathered and pickled. Measured on 2.13.0 in one
# process, 1.7 to 2.0 KiB an item (saves of 500 to 4,000 small tensors); stated as twice that.
# The coordinator (rank 0) holds every rank's plans when saving, and every rank holds the
# whole checkpoint's metadata when loading.
PLAN_BYTES_PER_ITEM: Final = 4 * 1024


def _largest_local_piece(tensors: Sequence[torch.Tensor]) -> int:
    """Bytes of the largest piece a rank stores of any of ``tensors``: a DTensor's local
    tensor, a ShardedTensor's largest local shard, a tensor whole."""
    pieces = []
    for value in tensors:
        if isinstance(value, ShardedTensor):
            pieces += [
                int(shard.tensor.numel()) * _itemsize(value) for shard in value.local_shards()
            ]
        else:
            pieces.append(local_bytes(value))
    return max(pieces, default=0)


def _stored_items(tree: Any) -> int:
    """How many items DCP stores for ``tree``: its tensors and other leaves."""
    if isinstance(tree, Mapping):
        return sum(_stored_items(value) for value in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(_stored_items(value) for value in tree)
    return 1


def _dcp_transient(state_dict: Any, planned_items: int) -> Footprint:
    largest = _largest_local_piece(list(_tensors(state_dict)))
    return Footprint(host=ITEMS_IN_FLIGHT * largest + PLAN_BYTES_PER_ITEM * planned_items)


def dcp_save_peak(state_dict: Any, *, rank: int, world_size: int) -> PeakBound:
    """Bounds ``dcp.save`` of ``state_dict`` through a ``FileSystemWriter``: what it writes
    goes to files, nothing is kept; each rank stages its items to the host one at a time
    (an accelerator's tensors are copied there, a view of a larger storage made whole)
    beside the plans of its items (of every rank's, on the coordinator)."""
    items = _stored_items(state_dict) * (world_size if rank == 0 else 1)
    transient = _dcp_transient(state_dict, items)
    return _bound("dcp.save", state_dict, Footprint(), transient)


def dcp_load_peak(state_dict: Any, *, world_size: int) -> PeakBound:
    """Bounds ``dcp.load`` into ``state_dict`` from a checkpoint of the same layout through
    a ``FileSystemReader``: every tensor is filled in place, nothing new is kept; each item
    is read to the host and decoded there, one at a time, beside the checkpoint's metadata
    (every rank's items)."""
    items = _stored_items(state_dict) * world_size
    transient = _dcp_transient(state_dict, items)
    return _bound("dcp.load", state_dict, Footprint(), transient)


def fsdp1_optim_state_dict_peak(
    held: Any,
    *,
    rank: int,
    unit_bytes: int,
    rank0_only: bool = False,
    cpu_offload: bool = False,
    shard_state: bool = False,
) -> PeakBound:
    """Bounds ``FSDP.optim_state_dict`` where ``held`` is the optimizer's sharded state dict
    (one entry per original parameter) and ``unit_bytes`` the largest unit's unsharded
    optimizer state. Each unit's state is gathered whole (``TRANSIENT_UNITS`` of it) and
    the result built from it: under FULL configs every original parameter's full state,
    kept on rank 0 alone with ``rank0_only`` and on the host with ``cpu_offload``; under
    SHARDED configs a new copy of each rank's pieces."""
    if shard_state:
        result, transient = _local_copies(held), Footprint()
    else:
        ranks_only = (0,) if rank0_only else ()
        gathered = gather_state_dict_peak(
            held, rank=rank, ranks_only=ranks_only, cpu_offload=cpu_offload
        )
        result, transient = gathered.result, gathered.transient
    name = (
        f"FSDP.optim_state_dict(rank0_only={rank0_only}, cpu_offload={cpu_offload}, "
        f"shard_state={shard_state})"
    )
    return _bound(name, held, result, transient + _unit(held, unit_bytes))


def fsdp1_optim_load_peak(held: Any, *, unit_bytes: int, shard_state: bool) -> PeakBound:
    """Bounds ``FSDP.optim_state_dict_to_load`` of a full (or, with ``shard_state``, a
    sharded) optimizer state dict held on every rank, into an optimizer holding ``held``:
    the result is a new copy of each of this rank's pieces; each unit's state is flattened
    whole beside it (``TRANSIENT_UNITS`` of it), a sharded input gathered into it one
    tensor at a time."""
    transient = _unit(held, unit_bytes)
    if shard_state:
        transient += _largest_step([value for value in _tensors(held) if _is_distributed(value)])
    name = f"FSDP.optim_state_dict_to_load(shard_state={shard_state})"
    return _bound(name, held, _local_copies(held), transient)
