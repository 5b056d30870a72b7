"""Mutants of ``torch/distributed/fsdp/_state_dict_utils.py`` (FSDP1 model state dicts)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.tensor import DTensor

from ci.mutation.mutants._mutant import FSDP_STATE_DICT_UTILS, mutant_maker
from ci.mutation.mutants._trees import rows_shifted

Fn = Callable[..., Any]
MODEL_STATE = "conformance/checks/test_fsdp1_model_state.py"
UPSTREAM_CASES = "conformance/checks/test_fsdp1_state_dict_upstream_cases.py"
RESHARD = "conformance/checks/test_fsdp1_reshard_loads.py"
MIXED_PRECISION = "conformance/checks/test_mixed_precision.py"


def _local_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, ShardedTensor):
        shards = value.local_shards()
        return shards[0].tensor if shards else None
    return value.to_local() if isinstance(value, DTensor) else None


def _strip_skipped(original: Fn) -> Fn:
    def replace(state_dict: dict[str, Any], old_prefix: str, new_prefix: str) -> None:
        if len(new_prefix) >= len(old_prefix):  # adding the prefix back on load still works
            original(state_dict, old_prefix, new_prefix)

    return replace


def _uneven_chunks_shifted(original: Fn) -> Fn:
    def chunk(tensor: torch.Tensor, rank: int, world_size: int, *args: Any, **kw: Any) -> Any:
        if tensor.dim() and tensor.shape[0] % world_size:
            tensor = rows_shifted(tensor)
        return original(tensor, rank, world_size, *args, **kw)

    return chunk


def _buffer_dtypes_kept(original: Fn) -> Fn:
    def dtypes(fsdp_state: Any, buffer_names: list[str]) -> list[torch.dtype | None]:
        original(fsdp_state, buffer_names)
        return [None] * len(buffer_names)

    return dtypes


def _loaded_shards_shifted(original: Fn) -> Fn:
    def pre_load(module: Any, fsdp_state: Any, state_dict: dict[str, Any], prefix: str) -> None:
        for key, value in state_dict.items():
            local = _local_tensor(value) if key.startswith(prefix) else None
            if local is not None and local.numel() > 1:
                local.copy_(rows_shifted(local.clone()))
        original(module, fsdp_state, state_dict, prefix)

    return pre_load


def _local_shards_shifted(original: Fn) -> Fn:
    def post(module: Any, fsdp_state: Any, state_dict: dict[str, Any], prefix: str) -> Any:
        result = original(module, fsdp_state, state_dict, prefix)
        for key, value in result.items():
            local = _local_tensor(value) if key.startswith(prefix) else None
            if local is not None and local.numel() > 1:
                local.copy_(rows_shifted(local.clone()))
        return result

    return post


def _rank0_only_ignored(original: Fn) -> Fn:
    def pre(fsdp_state: Any, module: Any, *args: Any, **kwargs: Any) -> None:
        fsdp_state._state_dict_config.rank0_only = False
        original(fsdp_state, module, *args, **kwargs)

    return pre


def _masters_in_the_compute_dtype(original: Fn) -> Fn:
    def hook(module: Any, fsdp_state: Any, state_dict: dict[str, Any], prefix: str) -> Any:
        state_dict = original(module, fsdp_state, state_dict, prefix)
        compute = getattr(fsdp_state.mixed_precision, "param_dtype", None)
        if compute is None:
            return state_dict
        return {  # the bug: gathered as the forward gathers them, then widened back
            key: value.to(compute).to(value.dtype)
            if isinstance(value, torch.Tensor) and value.dtype == torch.float32
            else value
            for key, value in state_dict.items()
        }

    return hook


_mutant = mutant_maker(FSDP_STATE_DICT_UTILS, MODEL_STATE, UPSTREAM_CASES, RESHARD)

MUTANTS = [
    _mutant(
        "wrapper_prefix_not_stripped",
        "_replace_by_prefix",
        "saving does not strip `_fsdp_wrapped_module.` from the keys",
        _strip_skipped,
        everywhere=False,
    ),
    _mutant(
        "sharded_state_takes_the_wrong_chunk_of_uneven_tensors",
        "_ext_chunk_tensor",
        "SHARDED_STATE_DICT cuts a parameter whose rows do not divide one element off",
        _uneven_chunks_shifted,
        everywhere=False,
    ),
    _mutant(
        "mixed_precision_buffers_saved_in_low_precision",
        "_get_orig_buffer_dtypes",
        "buffers are saved in their mixed-precision dtype, not their original one",
        _buffer_dtypes_kept,
        everywhere=False,
    ),
    _mutant(
        "sharded_load_off_by_one",
        "_sharded_pre_load_state_dict_hook",
        "SHARDED_STATE_DICT loads each local shard one element off",
        _loaded_shards_shifted,
    ),
    _mutant(
        "local_state_dict_off_by_one",
        "_local_post_state_dict_hook",
        "LOCAL_STATE_DICT saves the flat shard one element off",
        _local_shards_shifted,
    ),
    _mutant(
        "rank0_only_model_state_on_every_rank",
        "_full_pre_state_dict_hook",
        "FULL_STATE_DICT with rank0_only returns the full state dict on every rank",
        _rank0_only_ignored,
    ),
    mutant_maker(FSDP_STATE_DICT_UTILS, MIXED_PRECISION)(
        "full_state_dict_of_the_compute_copy",
        "_full_post_state_dict_hook",
        "under MixedPrecision FSDP1's full state dict gathers the parameters in the compute "
        "dtype, as its forward does, and widens them back: the fp32 masters' low bits are lost",
        _masters_in_the_compute_dtype,
    ),
]
