"""Oracle of ``torch/distributed/_state_dict_utils.py``.

Each public function names the upstream function it models and states its
contract. Differences from upstream are deliberate and documented: the
oracle names the key path of every error, refuses shape and dtype
mismatches that upstream would broadcast or convert silently, never changes
its inputs as a side effect, and keeps empty containers through flatten and
unflatten.
"""

from __future__ import annotations

import copy
import io
import itertools
import weakref
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.tensor import DTensor

from reference_impl._devices import group_device, pinning_accelerator
from reference_impl._gather import (
    full_tensor_of_dtensor,
    full_tensor_of_sharded_tensor,
    local_piece,
)

PathItem = str | int
KeyPath = tuple[PathItem, ...]
FlattenMapping = dict[str, KeyPath]
StateDict = dict[str, Any]
# (value, process group, device, companion) -> new value, as upstream's callbacks.
LeafFunc = Callable[[Any, dist.ProcessGroup | None, torch.device | None, Any], Any]

_PLAIN_LEAVES = (int, float, str, bytes, io.BytesIO)


def format_path(path: KeyPath) -> str:
    """``('optim', 'state', 0)`` → ``optim.state[0]``; the root is ``<root>``."""
    if not path:
        return "<root>"
    text = ""
    for item in path:
        text += f"[{item}]" if isinstance(item, int) else (f".{item}" if text else str(item))
    return text


class CompanionMismatch(ValueError):
    """A companion object differs in structure, type, shape or dtype; names the key path."""

    def __init__(self, path: KeyPath, what: str) -> None:
        super().__init__(f"{format_path(path)}: {what}")
        self.path = path


class UnsupportedValue(ValueError):
    """A value of a type state dicts may not hold (with ``type_check``); names the key path."""

    def __init__(self, path: KeyPath, value: object) -> None:
        super().__init__(
            f"{format_path(path)}: unsupported value type {type(value).__qualname__}; state dicts "
            "hold tensors, DTensors, ShardedTensors, int, float, str, bytes, io.BytesIO, None, "
            "dicts, lists and tuples"
        )
        self.path = path


def identity(
    value: Any, pg: dist.ProcessGroup | None, device: torch.device | None, companion: Any
) -> Any:
    """A leaf function that returns its value unchanged."""
    return value


@dataclass(frozen=True)
class _Walk:
    sharded_tensor_func: LeafFunc
    dtensor_func: LeafFunc
    tensor_func: LeafFunc
    pg: dist.ProcessGroup | None
    device: torch.device | None
    cpu_offload: bool
    keep: bool  # False on ranks outside ``ranks_only``
    type_check: bool
    non_blocking: bool

    def visit(self, value: Any, companion: Any, path: KeyPath) -> Any:
        result = self._apply(value, companion, path)
        if not self.keep:
            return {} if isinstance(result, dict) else None
        if isinstance(result, torch.Tensor):
            if companion is not None:
                return _copy_into(companion, result, path, self.non_blocking)
            if self.cpu_offload:
                return result.to("cpu")
        return result

    def _apply(self, value: Any, companion: Any, path: KeyPath) -> Any:
        if isinstance(value, ShardedTensor):
            return self.sharded_tensor_func(value, self.pg, self.device, companion)
        if isinstance(value, DTensor):
            return self.dtensor_func(value, self.pg, self.device, companion)
        if isinstance(value, torch.Tensor):
            return self.tensor_func(value, self.pg, self.device, companion)
        if value is None or isinstance(value, _PLAIN_LEAVES):
            return value
        if isinstance(value, dict):
            return self._visit_dict(value, companion, path)
        if isinstance(value, (list, tuple)):
            return self._visit_sequence(value, companion, path)
        if self.type_check:
            raise UnsupportedValue(path, value)
        return copy.deepcopy(value)

    def _visit_dict(self, value: dict[Any, Any], companion: Any, path: KeyPath) -> dict[Any, Any]:
        if companion is not None:
            if not isinstance(companion, dict):
                raise CompanionMismatch(
                    path, f"a dict, but the companion is {type(companion).__name__}"
                )
            if set(companion) != set(value):
                missing = sorted(map(str, set(value) - set(companion)))
                extra = sorted(map(str, set(companion) - set(value)))
                raise CompanionMismatch(
                    path, f"keys differ: companion lacks {missing}, companion has extra {extra}"
                )
        return {
            key: self.visit(item, None if companion is None else companion[key], (*path, key))
            for key, item in value.items()
        }

    def _visit_sequence(
        self, value: list[Any] | tuple[Any, ...], companion: Any, path: KeyPath
    ) -> Any:
        if companion is not None:
            if not isinstance(companion, (list, tuple)):
                raise CompanionMismatch(
                    path, f"a sequence, but the companion is {type(companion).__name__}"
                )
            if len(companion) != len(value):
                raise CompanionMismatch(
                    path, f"length {len(value)}, companion length {len(companion)}"
                )
        items = [
            self.visit(item, None if companion is None else companion[i], (*path, i))
            for i, item in enumerate(value)
        ]
        return tuple(items) if isinstance(value, tuple) else items


def _copy_into(companion: Any, source: torch.Tensor, path: KeyPath, non_blocking: bool) -> Any:
    """Copy ``source`` into the companion's storage and return the companion."""
    if not isinstance(companion, torch.Tensor):
        raise CompanionMismatch(path, f"a tensor, but the companion is {type(companion).__name__}")
    if source.shape != companion.shape or source.dtype != companion.dtype:
        raise CompanionMismatch(
            path,
            f"{source.dtype}{list(source.shape)} cannot go into a companion of "
            f"{companion.dtype}{list(companion.shape)}",
        )
    if isinstance(companion, DTensor):
        if not isinstance(source, DTensor):
            raise CompanionMismatch(path, "the companion is a DTensor, the value is not")
        companion.to_local().copy_(source.to_local(), non_blocking=non_blocking)
    elif isinstance(companion, ShardedTensor):
        if not isinstance(source, ShardedTensor):
            raise CompanionMismatch(path, "the companion is a ShardedTensor, the value is not")
        pairs = zip(companion.local_shards(), source.local_shards(), strict=True)
        for target, shard in pairs:
            target.tensor.copy_(shard.tensor, non_blocking=non_blocking)
    else:
        companion.copy_(source, non_blocking=non_blocking)
    return companion


def iterate_state_dict(
    iter_object: Any,
    sharded_tensor_func: LeafFunc,
    dtensor_func: LeafFunc,
    tensor_func: LeafFunc,
    *,
    pg: dist.ProcessGroup | None = None,
    device: torch.device | None = None,
    cpu_offload: bool = False,
    companion_obj: Any = None,
    ranks_only: tuple[int, ...] = (),
    type_check: bool = True,
    non_blocking: bool = True,
) -> Any:
    """Models ``_iterate_state_dict``: a new nested structure with each tensor leaf transformed.

    dicts, lists and tuples are rebuilt; ShardedTensor, DTensor and tensor
    leaves go through their function; int, float, str, bytes, BytesIO and
    None are kept as they are; other values raise (``type_check``) or are
    deep-copied. A tensor result is copied into the companion's tensor at
    the same path (which is returned), else moved to CPU with
    ``cpu_offload``. On ranks outside a non-empty ``ranks_only`` every
    value becomes None and every dict ``{}`` (collectives still run).
    """
    keep = not ranks_only or dist.get_rank(pg) in ranks_only
    walk = _Walk(
        sharded_tensor_func,
        dtensor_func,
        tensor_func,
        pg,
        device,
        cpu_offload,
        keep,
        type_check,
        non_blocking,
    )
    if companion_obj is None:
        return walk.visit(iter_object, None, ())
    with torch.no_grad():  # copies may land in parameters that require grad
        return walk.visit(iter_object, companion_obj, ())


def gather_state_dict(
    state_dict: StateDict,
    *,
    pg: dist.ProcessGroup | None = None,
    device: torch.device | None = None,
    cpu_offload: bool = False,
    ranks_only: tuple[int, ...] = (),
    type_check: bool = True,
) -> StateDict:
    """Models ``_gather_state_dict``: every DTensor and ShardedTensor becomes its full tensor.

    A DTensor's full tensor lies on its mesh's device type; a ShardedTensor's
    on its local shards' device (CPU when it has none), gathered over ``pg``
    (default group) on ``device`` or the group's device. Collective: every
    rank must call it with the same structure.
    """

    def sharded(
        value: ShardedTensor, pg: dist.ProcessGroup | None, device: torch.device | None, _: Any
    ) -> torch.Tensor:
        return full_tensor_of_sharded_tensor(value, pg, device)

    def dtensor(
        value: DTensor, pg: dist.ProcessGroup | None, device: torch.device | None, _: Any
    ) -> torch.Tensor:
        return full_tensor_of_dtensor(value)

    result: StateDict = iterate_state_dict(
        state_dict,
        sharded,
        dtensor,
        identity,
        pg=pg,
        device=device,
        cpu_offload=cpu_offload,
        ranks_only=ranks_only,
        type_check=type_check,
    )
    return result


def offload_state_dict_to_cpu(
    state_dict: StateDict, *, ranks_only: tuple[int, ...] = (), type_check: bool = True
) -> StateDict:
    """Models ``_offload_state_dict_to_cpu``: every tensor (DTensors stay DTensors) moved to CPU."""
    result: StateDict = iterate_state_dict(
        state_dict,
        identity,
        identity,
        identity,
        cpu_offload=True,
        ranks_only=ranks_only,
        type_check=type_check,
    )
    return result


def copy_state_dict(
    state_dict: StateDict,
    copy_state_dict: StateDict,
    non_blocking: bool = False,
    type_check: bool = True,
) -> StateDict:
    """Models ``_copy_state_dict``: copy every tensor into ``copy_state_dict``'s tensors.

    Returns a new structure whose tensors are ``copy_state_dict``'s own (the
    copies landed in them). Structures, shapes and dtypes must match.
    """
    result: StateDict = iterate_state_dict(
        state_dict,
        identity,
        identity,
        identity,
        companion_obj=copy_state_dict,
        type_check=type_check,
        non_blocking=non_blocking,
    )
    return result


def _pin_registered(tensor: torch.Tensor) -> torch.Tensor:
    """Page-lock ``tensor``'s existing (shared) memory; unregister it when the tensor dies.

    Memory that already exists can be page-locked only through CUDA's host registration,
    which is what torch does; on any other accelerator this is refused by name.
    """
    accelerator = pinning_accelerator()
    if accelerator != "cuda":
        raise RuntimeError(
            "pin_memory with share_memory registers the shared memory with CUDA "
            f"(cudaHostRegister); this build's accelerator is {accelerator!r}"
        )
    cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
    pointer = tensor.data_ptr()
    status = cudart.cudaHostRegister(pointer, tensor.numel() * tensor.element_size(), 0)
    if int(status) != 0:
        raise RuntimeError(f"cudaHostRegister failed with status {int(status)}")
    weakref.finalize(tensor, cudart.cudaHostUnregister, pointer)
    return tensor


def _cpu_like(value: torch.Tensor, pin_memory: bool, share_memory: bool) -> torch.Tensor:
    """New uninitialised CPU memory of ``value``'s size and dtype (contiguous)."""
    if value.dim() == 0:
        return torch.tensor(0, dtype=value.dtype)
    if value.numel() == 0 or value.data_ptr() == 0:
        empty = torch.zeros_like(value, device="cpu")
        return empty.share_memory_() if share_memory else empty  # type: ignore[no-untyped-call]
    fresh = torch.empty(tuple(value.size()), dtype=value.dtype)
    if share_memory:
        fresh.share_memory_()  # type: ignore[no-untyped-call]
        return _pin_registered(fresh) if pin_memory else fresh
    if pin_memory:
        pinning_accelerator()
        return fresh.pin_memory()
    return fresh


def create_cpu_state_dict(
    state_dict: StateDict, pin_memory: bool = False, share_memory: bool = False
) -> StateDict:
    """Models ``_create_cpu_state_dict``: same structure, fresh CPU memory for every tensor.

    Tensor contents are not copied (fill them with ``copy_state_dict``);
    zero-dim tensors become ``tensor(0)`` of their dtype. DTensors and
    ShardedTensors keep their metadata with fresh local memory; zero-dim
    DTensors and ShardedTensors without local shards are returned as they
    are. ``pin_memory`` page-locks the memory for the build's accelerator,
    ``share_memory`` puts it in shared memory; both at once register shared
    memory with CUDA (the only way torch has to page-lock memory that exists),
    which is much slower: use it only for long-lived buffers. Other values
    are deep-copied.
    """

    def tensor(value: torch.Tensor, pg: Any, device: Any, _: Any) -> torch.Tensor:
        return _cpu_like(value, pin_memory, share_memory)

    def dtensor(value: DTensor, pg: Any, device: Any, _: Any) -> DTensor:
        # Built from metadata, never by deep-copying ``value``: that copies data
        # only to drop it, and fails where the local tensor is a view at an offset.
        if value.dim() == 0:
            return value
        return _dtensor_holding(value, _cpu_like(value.to_local(), pin_memory, share_memory))

    def sharded(value: ShardedTensor, pg: Any, device: Any, _: Any) -> ShardedTensor:
        if not value.local_shards():
            return value
        moved = value.cpu() if value.device.type != "cpu" else copy.deepcopy(value)
        for shard in moved.local_shards():
            shard.tensor = _cpu_like(shard.tensor, pin_memory, share_memory)
        return moved

    result: StateDict = iterate_state_dict(state_dict, sharded, dtensor, tensor, type_check=False)
    return result


def check_state_dict_similarity(state_dict: StateDict, compared_state_dict: StateDict) -> bool:
    """Models ``_check_state_dict_similarity``: same structure, and same size and dtype per tensor.

    Pure: neither argument changes (upstream 2.13 copies ``state_dict``'s
    values into ``compared_state_dict`` as a side effect).
    """
    try:
        _check_similar(state_dict, compared_state_dict, ())
    except CompanionMismatch:
        return False
    return True


def _check_similar(value: Any, other: Any, path: KeyPath) -> None:
    if isinstance(value, torch.Tensor) and not isinstance(value, (DTensor, ShardedTensor)):
        if (
            not isinstance(other, torch.Tensor)
            or other.size() != value.size()
            or other.dtype != value.dtype
        ):
            raise CompanionMismatch(path, "size or dtype differs")
    elif isinstance(value, dict):
        if not isinstance(other, dict) or set(other) != set(value):
            raise CompanionMismatch(path, "keys differ")
        for key, item in value.items():
            _check_similar(item, other[key], (*path, key))
    elif isinstance(value, (list, tuple)):
        if not isinstance(other, (list, tuple)) or len(other) != len(value):
            raise CompanionMismatch(path, "lengths differ")
        for index, item in enumerate(value):
            _check_similar(item, other[index], (*path, index))


def _dtensor_like(like: DTensor, local: torch.Tensor) -> DTensor:
    """A DTensor with ``like``'s mesh, placements, shape and stride, holding ``local``."""
    return DTensor.from_local(
        local,
        like.device_mesh,
        like.placements,
        run_check=False,
        shape=like.shape,
        stride=like.stride(),
    )


def _dtensor_holding(like: DTensor, local: torch.Tensor) -> DTensor:
    """``_dtensor_like`` with ``local`` left on its own device: ``DTensor.from_local`` moves a
    CPU tensor to an accelerator mesh's device, while ``_create_cpu_state_dict`` promises CPU
    memory under the same mesh. Built around a meta stand-in (which ``from_local`` never
    moves), then given ``local``."""
    shell = _dtensor_like(like, torch.empty_like(local, device="meta"))
    shell._local_tensor = local
    return shell


def _fresh_on(piece: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``piece`` on ``device`` in new contiguous memory (never a view of the full tensor)."""
    return piece.to(device).clone(memory_format=torch.contiguous_format)


@dataclass(frozen=True)
class _TensorMeta:
    """What non-source ranks learn about a tensor before it is broadcast."""

    size: torch.Size
    dtype: torch.dtype


def _place_full_tensor(
    local_state_dict: StateDict, key: str, full: torch.Tensor, device: torch.device
) -> None:
    """Put ``full`` (or this rank's piece of it) into ``local_state_dict[key]`` if present."""
    local = local_state_dict.get(key)
    if local is None:
        return
    if isinstance(local, DTensor):
        piece = local_piece(full, local.device_mesh, local.placements)
        if local.is_meta:
            local_state_dict[key] = _dtensor_like(local, _fresh_on(piece, device))
        else:
            with torch.no_grad():
                local.to_local().copy_(piece)
    else:
        local_state_dict[key] = full.to(device)


def broadcast_state_dict(
    full_state_dict: StateDict,
    local_state_dict: StateDict,
    device: torch.device,
    pg: dist.ProcessGroup | None = None,
    strict: bool = False,
    cpu_offload: bool = False,
) -> None:
    """Models ``_broadcast_state_dict``: fill each ``local_state_dict`` from rank 0's full dict.

    Only global rank 0 reads ``full_state_dict``. Non-tensor values and
    zero-dim tensors (as CPU tensors) replace present keys; other tensors are
    broadcast one at a time, on ``device`` or a device the group supports,
    and land on ``device``: a DTensor receives its local piece in place (a
    meta DTensor is replaced by a new one), a tensor is replaced. With
    ``strict``, local keys missing from the full dict are removed; with
    ``cpu_offload``, received tensors move to CPU. Peak memory stays at one
    full tensor beyond the result.
    """
    catalogue: dict[str, Any] = {}
    if dist.get_rank() == 0:
        for key, value in full_state_dict.items():
            if not isinstance(value, torch.Tensor):
                catalogue[key] = value
            elif value.dim() == 0:
                catalogue[key] = value.detach().cpu()
            else:
                catalogue[key] = _TensorMeta(value.size(), value.dtype)
    holder = [catalogue]
    dist.broadcast_object_list(holder, src=0, group=pg)
    catalogue = holder[0]
    comm_device = group_device(pg, device)
    for key, entry in catalogue.items():
        if not isinstance(entry, _TensorMeta):
            if key in local_state_dict:
                local_state_dict[key] = entry
            continue
        if dist.get_rank() == 0:
            buffer = full_state_dict[key].detach().to(comm_device)
        else:
            buffer = torch.empty(entry.size, dtype=entry.dtype, device=comm_device)
        dist.broadcast(buffer, src=0, group=pg)
        _place_full_tensor(local_state_dict, key, buffer, device)
        if cpu_offload and key in local_state_dict:
            local_state_dict[key] = local_state_dict[key].cpu()
    if strict:
        for key in set(local_state_dict) - set(catalogue):
            del local_state_dict[key]


def distribute_state_dict(
    full_state_dict: StateDict,
    local_state_dict: StateDict,
    device: torch.device,
    pg: dist.ProcessGroup | None = None,
) -> None:
    """Models ``_distribute_state_dict``: every rank holds the full dict; no communication.

    Non-tensor values are set, zero-dim tensors set as CPU tensors; for keys
    present locally, a DTensor is replaced by a new DTensor holding this
    rank's piece (on ``device``) and a tensor by the full tensor on ``device``.
    """
    for key, value in full_state_dict.items():
        if not isinstance(value, torch.Tensor):
            local_state_dict[key] = value
        elif value.dim() == 0:
            local_state_dict[key] = value.detach().cpu()
        elif (local := local_state_dict.get(key)) is None:
            continue
        elif isinstance(local, DTensor):
            piece = local_piece(value.detach(), local.device_mesh, local.placements)
            local_state_dict[key] = _dtensor_like(local, _fresh_on(piece, device))
        else:
            local_state_dict[key] = value.detach().to(device)


def traverse_state_dict(
    state_dict: Mapping[str, Any], visitor: Callable[[KeyPath, Any], None]
) -> None:
    """Models ``_traverse_state_dict``: call ``visitor(path, value)`` for every leaf.

    Mapping keys become ``str`` path items and sequence positions ``int``
    ones. Unlike upstream, an empty mapping or sequence is a leaf (so it
    survives flatten and unflatten).
    """

    def visit(path: KeyPath, value: Any) -> None:
        if isinstance(value, Mapping) and value:
            for key, item in value.items():
                visit((*path, str(key)), item)
        elif isinstance(value, (list, tuple)) and value:
            for index, item in enumerate(value):
                visit((*path, index), item)
        else:
            visitor(path, value)

    for key, value in state_dict.items():
        visit((str(key),), value)


def flatten_state_dict(state_dict: Mapping[str, Any]) -> tuple[StateDict, FlattenMapping]:
    """Models ``_flatten_state_dict``: one level, keys joined by ``.``, with the path of each.

    Raises ``ValueError`` naming both paths when two paths flatten to the same key.
    """
    flat: StateDict = {}
    mapping: FlattenMapping = {}

    def add(path: KeyPath, value: Any) -> None:
        key = ".".join(map(str, path))
        if key in flat:
            raise ValueError(
                f"duplicated flatten key {key!r}: from {format_path(mapping[key])} "
                f"and {format_path(path)}"
            )
        flat[key] = value
        mapping[key] = path

    traverse_state_dict(state_dict, add)
    return flat, mapping


def set_element(root: StateDict, path: KeyPath, value: Any) -> None:
    """Models ``_set_element``: set ``value`` at ``path``, creating dicts (str) and lists (int).

    Lists grow with None up to the index. A path that crosses a non-container
    raises ``ValueError`` naming it.
    """
    container: Any = root
    for depth, (item, following) in enumerate(itertools.pairwise(path)):
        default: Any = {} if isinstance(following, str) else []
        container = _child(container, item, default, path[: depth + 1])
    _assign(container, path[-1], value, path)


def _child(container: Any, item: PathItem, default: Any, where: KeyPath) -> Any:
    if isinstance(container, MutableMapping):
        return container.setdefault(item, default)
    if isinstance(container, list) and isinstance(item, int):
        _grow(container, item)
        if container[item] is None:
            container[item] = default
        return container[item]
    raise ValueError(f"{format_path(where)}: cannot descend into {type(container).__name__}")


def _assign(container: Any, item: PathItem, value: Any, path: KeyPath) -> None:
    if isinstance(container, list) and isinstance(item, int):
        _grow(container, item)
    elif not isinstance(container, MutableMapping):
        raise ValueError(f"{format_path(path)}: cannot set an item in {type(container).__name__}")
    container[item] = value


def _grow(items: list[Any], index: int) -> None:
    items.extend([None] * (index + 1 - len(items)))


def unflatten_state_dict(state_dict: Mapping[str, Any], mapping: FlattenMapping) -> StateDict:
    """Models ``_unflatten_state_dict``: rebuild the nested dict from flat keys and their paths.

    Sequences come back as lists. A flat key without a path raises ``KeyError`` naming it.
    """
    nested: StateDict = {}
    for key, value in state_dict.items():
        if key not in mapping:
            raise KeyError(f"flat key {key!r} has no path in the mapping")
        set_element(nested, mapping[key], value)
    return nested
