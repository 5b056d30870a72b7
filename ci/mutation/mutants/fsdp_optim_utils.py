"""Mutants of ``torch/distributed/fsdp/_optim_utils.py`` (FSDP1 optimizer state)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ci.mutation.mutants._mutant import FSDP_OPTIM_UTILS, mutant_maker
from ci.mutation.mutants._trees import map_leaves, rows_shifted

Fn = Callable[..., Any]
OPTIM = "conformance/checks/test_fsdp1_optim_state.py"
LEGACY = "conformance/checks/test_fsdp1_legacy_optim_apis.py"
CORNERS = "conformance/checks/test_fsdp1_optim_corner_cases.py"
RESHARD = "conformance/checks/test_fsdp1_reshard_loads.py"
UPSTREAM_CASES = "conformance/checks/test_fsdp1_optim_upstream_cases.py"


def _shift(value: Any) -> Any:
    positive_dim = isinstance(value, torch.Tensor) and value.dim() > 0
    return rows_shifted(value) if positive_dim else value


def _results_shifted(original: Fn) -> Fn:
    """Every positive-dim tensor of the result one element off: a wrong offset."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return map_leaves(original(*args, **kwargs), _shift)

    return call


def _flattened_shifted(original: Fn) -> Fn:
    def flatten(*args: Any, **kwargs: Any) -> torch.Tensor:
        return rows_shifted(original(*args, **kwargs))

    return flatten


def _argument_forced(index: int, name: str, value: bool) -> Callable[[Fn], Fn]:
    """A call whose argument ``name`` (positional ``index``) is always ``value``."""

    def mutate(original: Fn) -> Fn:
        def call(*args: Any, **kwargs: Any) -> Any:
            if len(args) > index:
                args = (*args[:index], value, *args[index + 1 :])
            else:
                kwargs[name] = value
            return original(*args, **kwargs)

        return call

    return mutate


def _zero_dim_summed(original: Fn) -> Fn:
    def flatten(state_name: str, zero_dim_tensors: list[Any], names: list[str]) -> Any:
        value = original(state_name, zero_dim_tensors, names)
        present = [t for t in zero_dim_tensors if t is not None]
        return sum(present[1:], value) if torch.is_tensor(value) else value

    return flatten


def _non_tensor_dropped(original: Fn) -> Fn:
    def flatten(state_name: str, non_tensors: list[Any], names: list[str]) -> Any:
        original(state_name, non_tensors, names)
        return None

    return flatten


def _groups_reversed(original: Fn) -> Fn:
    def unflatten(*args: Any) -> Any:
        return original(*args)[::-1]

    return unflatten


def _keys_to_params_reversed(original: Fn) -> Fn:
    def mapping(*args: Any, **kwargs: Any) -> dict[Any, Any]:
        key_to_param = original(*args, **kwargs)
        return dict(zip(key_to_param, reversed(list(key_to_param.values())), strict=True))

    return mapping


_mutant = mutant_maker(FSDP_OPTIM_UTILS, OPTIM, CORNERS, LEGACY, RESHARD, UPSTREAM_CASES)

MUTANTS = [
    _mutant(
        "unflatten_with_offsets_off_by_one",
        "_unflatten_optim_state",
        "flat optimizer state is cut into parameters one element off (flat parameters)",
        _results_shifted,
    ),
    _mutant(
        "orig_param_state_gathered_off_by_one",
        "_gather_all_orig_param_state",
        "use_orig_params: each parameter's gathered state one element off",
        _results_shifted,
    ),
    _mutant(
        "rank0_only_state_on_every_rank",
        "_optim_state_dict",
        "rank0_only optimizer state is returned on every rank",
        _argument_forced(4, "rank0_only", False),
    ),
    _mutant(
        "sharded_optimizer_state_returned_full",
        "_optim_state_dict",
        "the sharded optimizer state dict holds full tensors",
        _argument_forced(5, "shard_state", False),
    ),
    _mutant(
        "zero_dim_state_summed_on_load",
        "_flatten_zero_dim_tensor_optim_state",
        "a flat parameter's zero-dim state (step) is the sum of its parameters' values",
        _zero_dim_summed,
    ),
    _mutant(
        "non_tensor_state_dropped_on_load",
        "_flatten_non_tensor_optim_state",
        "non-tensor optimizer state loads as None",
        _non_tensor_dropped,
        CORNERS,
    ),
    _mutant(
        "flattened_state_off_by_one_on_load",
        "_flatten_tensor_optim_state",
        "loading flattens each parameter's state into the flat parameter one element off",
        _flattened_shifted,
    ),
    _mutant(
        "orig_param_state_sharded_off_by_one_on_load",
        "_shard_orig_param_state",
        "use_orig_params: loading takes each rank's shard of the state one element off",
        _results_shifted,
        f"{OPTIM}::test_optim_state_dict_to_load_matches_the_oracle[w2-fsdp1_full_shard_orig-adam-full]",
    ),
    _mutant(
        "param_groups_unflattened_in_reverse",
        "_unflatten_param_groups",
        "saved param groups come out in the reverse order",
        _groups_reversed,
    ),
    _mutant(
        "parameter_keys_mapped_in_reverse",
        "_get_param_key_to_param",
        "optimizer parameter keys are mapped to the parameters in the reverse order",
        _keys_to_params_reversed,
        LEGACY,
    ),
    _mutant(
        "offloaded_state_left_on_device",
        "_optim_state_dict",
        "cpu_offload is ignored: gathered optimizer state stays on the device",
        _argument_forced(9, "cpu_offload", False),
    ),
]
