"""Mutants of ``torch/distributed/_state_dict_utils.py``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from ci.mutation.mutants._mutant import STATE_DICT_UTILS, mutant_maker
from ci.mutation.mutants._trees import get_path, map_leaves, rows_shifted, tensor_paths, with_leaf

Fn = Callable[..., Any]
UTILS = "conformance/checks/test_state_dict_utils.py"
UPSTREAM_CASES = "conformance/checks/test_state_dict_utils_upstream_cases.py"
PEAK_MEMORY = "conformance/checks/test_peak_memory.py"
LOADING = "conformance/checks/test_loading_leaves_its_input.py"
META = "conformance/checks/test_meta_device_loads.py"


def _gather_returns_local_shards(original: Fn) -> Fn:
    def gather(state_dict: dict[str, Any], **kwargs: Any) -> Any:
        local = map_leaves(state_dict, lambda v: v.to_local() if isinstance(v, DTensor) else v)
        return original(local, **kwargs)

    return gather


def _without_ranks_only(original: Fn) -> Fn:
    def call(state_dict: dict[str, Any], **kwargs: Any) -> Any:
        return original(state_dict, **{**kwargs, "ranks_only": ()})

    return call


def _without_type_check(original: Fn) -> Fn:
    def call(state_dict: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        return original(state_dict, *args, **{**kwargs, "type_check": False})

    return call


def _unpad_keeps_a_padding_element(original: Fn) -> Fn:
    def all_gather(sharded_tensor: Any, *args: Any, **kwargs: Any) -> Any:
        full = original(sharded_tensor, *args, **kwargs)
        size = dist.get_world_size(kwargs.get("pg") or (args[0] if args else None))
        if full.dim() and full.shape[0] % size:
            full.view(-1)[-1] = 0  # the padding's zero where the last element belongs
        return full

    return all_gather


def _offload_leaves_the_first_tensor(original: Fn) -> Fn:
    def offload(state_dict: dict[str, Any], **kwargs: Any) -> Any:
        result = original(state_dict, **kwargs)
        paths = tensor_paths(result)
        if paths:
            result = with_leaf(result, paths[0], get_path(state_dict, paths[0]))
        return result

    return offload


def _copy_returns_the_sources_tensors(original: Fn) -> Fn:
    def copy(
        state_dict: dict[str, Any], copy_state_dict: dict[str, Any], *args: Any, **kw: Any
    ) -> Any:
        original(state_dict, copy_state_dict, *args, **kw)
        return map_leaves(state_dict, lambda value: value)

    return copy


def _copy_skips_the_last_tensor(original: Fn) -> Fn:
    def copy(
        state_dict: dict[str, Any], copy_state_dict: dict[str, Any], *args: Any, **kw: Any
    ) -> Any:
        paths = tensor_paths(copy_state_dict)
        kept = get_path(copy_state_dict, paths[-1]).clone() if paths else None
        result = original(state_dict, copy_state_dict, *args, **kw)
        if paths:
            get_path(copy_state_dict, paths[-1]).copy_(kept)
        return result

    return copy


def _cpu_state_dict_reuses_cpu_tensors(original: Fn) -> Fn:
    def create(state_dict: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        result = original(state_dict, *args, **kwargs)
        for path in tensor_paths(result):
            source = get_path(state_dict, path)
            if type(source) is torch.Tensor and source.device.type == "cpu":
                result = with_leaf(result, path, source)
        return result

    return create


def _cpu_state_dict_ignores_share_memory(original: Fn) -> Fn:
    def create(
        state_dict: dict[str, Any], pin_memory: bool = False, share_memory: bool = False
    ) -> Any:
        return original(state_dict, pin_memory=pin_memory, share_memory=False)

    return create


def _in_float32(tree: Any) -> Any:
    return map_leaves(tree, lambda v: v.float() if type(v) is torch.Tensor else v)


def _similarity_ignores_dtypes(original: Fn) -> Fn:
    def similar(state_dict: dict[str, Any], compared: dict[str, Any]) -> bool:
        return bool(original(_in_float32(state_dict), _in_float32(compared)))

    return similar


def _broadcast_skips_zero_dim_tensors(original: Fn) -> Fn:
    def broadcast(full: dict[str, Any], local: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        kept = {
            key: value.clone()
            for key, value in local.items()
            if type(value) is torch.Tensor and value.dim() == 0
        }
        original(full, local, *args, **kwargs)
        if dist.get_rank() != 0:
            local.update(kept)

    return broadcast


def _distribute_shifts_uneven_pieces(original: Fn) -> Fn:
    def distribute(full: dict[str, Any], local: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        original(full, local, *args, **kwargs)
        for value in local.values():
            uneven = (
                isinstance(value, DTensor)
                and value.dim()
                and value.shape[0] % value.device_mesh.size()
            )
            if uneven:
                piece = value.to_local()
                piece.copy_(rows_shifted(piece))

    return distribute


def _distribute_keeps_views_of_the_full_tensor(original: Fn) -> Fn:
    def distribute(local: dict[str, Any], keys: list[str], *args: Any, **kwargs: Any) -> None:
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        views = {}
        for key in keys:
            entry = local.get(key)
            if entry is None or torch.is_tensor(entry) or not entry[0].is_meta:
                continue
            meta, full = entry
            shape, offset = compute_local_shape_and_global_offset(
                full.shape, meta.device_mesh, meta.placements
            )
            piece = full[
                tuple(slice(o, o + n) for n, o in zip(shape, offset, strict=True))
            ].detach()
            views[key] = DTensor.from_local(
                piece, meta.device_mesh, meta.placements, shape=meta.shape, stride=meta.stride()
            )
        original(local, keys, *args, **kwargs)
        local.update(views)

    return distribute


def _gather_everywhere_then_drop(original: Fn) -> Fn:
    def gather(state_dict: dict[str, Any], **kwargs: Any) -> Any:
        ranks_only = kwargs.get("ranks_only", ())
        everywhere = original(state_dict, **{**kwargs, "ranks_only": ()})
        if not ranks_only or dist.get_rank(kwargs.get("pg")) in ranks_only:
            return everywhere
        return {}

    return gather


def _broadcast_every_tensor_first(original: Fn) -> Fn:
    def broadcast(full: dict[str, Any], local: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        whole = {key: torch.empty(0) for key in local}  # each key receives its full tensor
        original(full, whole, *args, **kwargs)
        original(full, local, *args, **kwargs)
        del whole

    return broadcast


def _broadcast_keeps_keys_not_held(original: Fn) -> Fn:
    def broadcast(full: dict[str, Any], local: dict[str, Any], keys: list[str], *args: Any) -> None:
        for key in keys:
            if local.get(key) is None:
                local[key] = torch.empty(0)  # a plain tensor: replaced by the one received
        original(full, local, keys, *args)

    return broadcast


def _copy_through_temporaries(original: Fn) -> Fn:
    def copy(
        state_dict: dict[str, Any], copy_state_dict: dict[str, Any], *args: Any, **kw: Any
    ) -> Any:
        clones = map_leaves(
            state_dict,
            lambda v: v.clone() if type(v) is torch.Tensor or isinstance(v, DTensor) else v,
        )
        return original(clones, copy_state_dict, *args, **kw)

    return copy


def _flatten_joins_with_slashes(original: Fn) -> Fn:
    def flatten(state_dict: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        flat, mapping = original(state_dict)
        renamed = {key.replace(".", "/"): value for key, value in flat.items()}
        return renamed, {key.replace(".", "/"): path for key, path in mapping.items()}

    return flatten


def _unflatten_turns_lists_into_dicts(original: Fn) -> Fn:
    def unflatten(state_dict: dict[str, Any], mapping: dict[str, Any]) -> Any:
        as_keys = {key: tuple(str(part) for part in path) for key, path in mapping.items()}
        return original(state_dict, as_keys)

    return unflatten


_mutant = mutant_maker(STATE_DICT_UTILS, UPSTREAM_CASES, UTILS)
# Right values, more memory: the peak-memory checks alone can see these.
_memory_mutant = mutant_maker(STATE_DICT_UTILS, PEAK_MEMORY, UPSTREAM_CASES, UTILS)

MUTANTS = [
    _mutant(
        "gather_returns_local_shards",
        "_gather_state_dict",
        "a DTensor 'gathers' to its local shard",
        _gather_returns_local_shards,
    ),
    _mutant(
        "gather_ignores_ranks_only",
        "_gather_state_dict",
        "ranks_only is ignored: every rank keeps the gathered state dict",
        _without_ranks_only,
    ),
    _mutant(
        "gather_skips_type_check",
        "_gather_state_dict",
        "type_check is ignored: unsupported leaves pass silently",
        _without_type_check,
    ),
    _mutant(
        "unpad_keeps_a_padding_element",
        "_all_gather_sharded_tensor",
        "unpadding a gathered ShardedTensor of uneven size keeps one padding element",
        _unpad_keeps_a_padding_element,
    ),
    _mutant(
        "offload_ignores_ranks_only",
        "_offload_state_dict_to_cpu",
        "offload keeps the state dict on every rank despite ranks_only",
        _without_ranks_only,
    ),
    _mutant(
        "offload_leaves_one_tensor_on_device",
        "_offload_state_dict_to_cpu",
        "the first tensor is left where it was instead of copied to the CPU",
        _offload_leaves_the_first_tensor,
        equivalent=(
            "on CPU worlds every tensor is already on the CPU, and torch's offload returns such "
            "a tensor as it is (the same object), so leaving one in place changes nothing; "
            "observable under NCCL only"
        ),
    ),
    _mutant(
        "copy_returns_the_sources_tensors",
        "_copy_state_dict",
        "the copy returns the source's tensors instead of the companion's",
        _copy_returns_the_sources_tensors,
    ),
    _mutant(
        "copy_skips_the_last_tensor",
        "_copy_state_dict",
        "the last tensor of the companion is not written",
        _copy_skips_the_last_tensor,
    ),
    _mutant(
        "cpu_state_dict_aliases_cpu_tensors",
        "_create_cpu_state_dict",
        "a CPU source tensor is reused instead of copied",
        _cpu_state_dict_reuses_cpu_tensors,
    ),
    _mutant(
        "cpu_state_dict_ignores_share_memory",
        "_create_cpu_state_dict",
        "share_memory=True gives ordinary memory",
        _cpu_state_dict_ignores_share_memory,
    ),
    _mutant(
        "similarity_ignores_dtypes",
        "_check_state_dict_similarity",
        "state dicts differing only in dtypes are called similar",
        _similarity_ignores_dtypes,
    ),
    _mutant(
        "broadcast_skips_zero_dim_tensors",
        "_broadcast_state_dict",
        "zero-dim tensors keep their local values on ranks other than 0",
        _broadcast_skips_zero_dim_tensors,
    ),
    _mutant(
        "broadcast_keeps_keys_the_rank_does_not_hold",
        "_broadcast_tensors",
        "every tensor rank 0 broadcasts is kept, also where the rank holds no such key (a "
        "pipeline's stage then loads the other stages' layers)",
        _broadcast_keeps_keys_not_held,
        LOADING,
    ),
    _mutant(
        "distribute_takes_the_wrong_rows_of_uneven_tensors",
        "_distribute_state_dict",
        "a DTensor whose first dimension does not divide gets its piece one element off",
        _distribute_shifts_uneven_pieces,
    ),
    _mutant(
        "flatten_joins_keys_with_slashes",
        "_flatten_state_dict",
        "flattened keys are joined with '/' instead of '.'",
        _flatten_joins_with_slashes,
    ),
    _mutant(
        "unflatten_turns_lists_into_dicts",
        "_unflatten_state_dict",
        "list positions are restored as string keys of dicts",
        _unflatten_turns_lists_into_dicts,
    ),
    _mutant(
        "distribute_keeps_views_of_the_full_tensor",
        "_distribute_tensors",
        "a model built on meta, loaded from a full state dict, gets each piece as a view of "
        "the full tensor it was cut from (no copy): right values, and every rank keeps every "
        "whole tensor alive",
        _distribute_keeps_views_of_the_full_tensor,
        META,
    ),
    _memory_mutant(
        "gather_holds_every_tensor_outside_ranks_only",
        "_gather_state_dict",
        "ranks outside ranks_only gather the whole state dict and drop it only at the end "
        "(they return nothing, as they should)",
        _gather_everywhere_then_drop,
    ),
    _memory_mutant(
        "broadcast_materializes_every_tensor_first",
        "_broadcast_state_dict",
        "every rank receives every full tensor before the pieces are placed",
        _broadcast_every_tensor_first,
    ),
    _memory_mutant(
        "copy_through_a_temporary_per_tensor",
        "_copy_state_dict",
        "the source is cloned whole before being copied into the companion",
        _copy_through_temporaries,
    ),
]
