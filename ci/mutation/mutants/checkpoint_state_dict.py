"""Mutants of ``torch/distributed/checkpoint/state_dict.py``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.nn.modules.module import _IncompatibleKeys

from ci.mutation.mutants._mutant import CHECKPOINT_STATE_DICT, mutant_maker

Fn = Callable[..., Any]
GET_SET = "conformance/checks/test_get_set_state_dict.py"
MODELS = "conformance/checks/test_model_matrix.py"
FULL = "conformance/checks/test_full_state_dict.py"
FAILURES = "conformance/checks/test_upstream_failures.py"
OBSERVING = "conformance/checks/test_observing_is_free.py"
RESUMING = "conformance/checks/test_resuming_commutes_with_training.py"
LOADING = "conformance/checks/test_loading_leaves_its_input.py"
MALFORMED = "conformance/checks/test_malformed_loads_name_the_key.py"
PEAK_MEMORY = "conformance/checks/test_peak_memory.py"
META_LOADS = "conformance/checks/test_meta_device_loads.py"


@contextlib.contextmanager
def _changed(info: Any, **fields: Any) -> Iterator[None]:
    """``info``'s fields set to ``fields`` for the duration of one call."""
    before = {name: getattr(info, name) for name in fields}
    for name, value in fields.items():
        setattr(info, name, value)
    try:
        yield
    finally:
        for name, value in before.items():
            setattr(info, name, value)


def _fqns_keeping(prefix_flag: str) -> Callable[[Fn], Fn]:
    def mutate(original: Fn) -> Fn:
        def fqns(model: Any, name: str, *args: Any, **kwargs: Any) -> Any:
            names = ("dsd_fqn_modifiers", "skip_ddp_prefix", "skip_compiler_prefix")
            call = dict(zip(names, args, strict=False)) | kwargs
            return original(model, name, **{**call, prefix_flag: False})

        return fqns

    return mutate


def _fqn_modifiers_unread(original: Fn) -> Fn:
    def iterate(model: Any, *_: Any, **__: Any) -> Any:
        return original(model, "_no_module_has_this")

    return iterate


def _compile_prefix_stripped_at_the_top_only(original: Fn) -> Fn:
    def fqns(model: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        names = ("dsd_fqn_modifiers", "skip_ddp_prefix", "skip_compiler_prefix")
        call = dict(zip(names, args, strict=False)) | kwargs
        kept = original(model, name, **{**call, "skip_compiler_prefix": False})
        if not call.get("skip_compiler_prefix", True):
            return kept
        return {fqn.removeprefix("_orig_mod.") for fqn in kept}

    return fqns


def _frozen_params_kept(original: Fn) -> Fn:
    def get(model: Any, info: Any) -> Any:
        with _changed(info, ignore_frozen_params=False):
            return original(model, info)

    return get


def _full_offloaded_on_every_rank(original: Fn) -> Fn:
    def full_or_cpu(state_dict: dict[str, Any], info: Any) -> Any:
        if not info.full_state_dict:
            return original(state_dict, info)
        from torch.distributed import _state_dict_utils

        return _state_dict_utils._gather_state_dict(state_dict, cpu_offload=info.cpu_offload)

    return full_or_cpu


def _full_offloaded_gathered_everywhere(original: Fn) -> Fn:
    def full_or_cpu(state_dict: dict[str, Any], info: Any) -> Any:
        if not (info.full_state_dict and info.cpu_offload and dist.is_initialized()):
            return original(state_dict, info)
        from torch.distributed import _state_dict_utils

        gathered = _state_dict_utils._gather_state_dict(state_dict, cpu_offload=True)
        return gathered if dist.get_rank() == 0 else {}

    return full_or_cpu


def _without_keys(drop: Callable[[str, Any, dict[str, Any]], bool]) -> Callable[[Fn], Fn]:
    """A model getter whose result loses each key ``drop(key, value, kept_so_far)`` names."""

    def mutate(original: Fn) -> Fn:
        def get(model: Any, info: Any) -> dict[str, Any]:
            kept: dict[str, Any] = {}
            for key, value in original(model, info).items():
                if not drop(key, value, kept):
                    kept[key] = value
            return kept

        return get

    return mutate


def _is_extra_state(key: str, value: Any, kept: dict[str, Any]) -> bool:
    return key.endswith("_extra_state")


def _is_a_second_name(key: str, value: Any, kept: dict[str, Any]) -> bool:
    """The value views the same memory as an earlier key's (a tied parameter's second FQN)."""
    return any(_same_memory(value, earlier) for earlier in kept.values())


def _same_memory(one: Any, other: Any) -> bool:
    one, other = (v.to_local() if isinstance(v, DTensor) else v for v in (one, other))
    if type(one) is not torch.Tensor or type(other) is not torch.Tensor or not one.numel():
        return False
    return (one.data_ptr(), one.shape, one.stride()) == (
        other.data_ptr(),
        other.shape,
        other.stride(),
    )


def _groups_reversed(original: Fn) -> Fn:
    def call(*args: Any) -> Any:
        result = original(*args)
        if isinstance(result, dict) and len(result.get("param_groups", [])) > 1:
            result["param_groups"] = result["param_groups"][::-1]
        return result

    return call


def _first_state_dropped(original: Fn) -> Fn:
    def split(*args: Any) -> Any:
        result = original(*args)
        if result.get("state"):
            del result["state"][next(iter(result["state"]))]
        return result

    return split


def _frozen_state_dropped(original: Fn) -> Fn:
    def split(model: Any, optim: Any, optim_state_dict: Any, info: Any) -> Any:
        result = original(model, optim, optim_state_dict, info)
        frozen = {
            fqn
            for group in optim.param_groups
            for param in group["params"]
            if not param.requires_grad
            for fqn in info.fqn_param_mapping[param]
        }
        result["state"] = {key: v for key, v in result["state"].items() if key not in frozen}
        return result

    return split


def _step_dropped(original: Fn) -> Fn:
    def get(*args: Any) -> Any:
        result = original(*args)
        for entry in result.get("state", {}).values():
            entry.pop("step", None)
        return result

    return get


def _no_lazy_init(original: Fn) -> Fn:
    def init(optim: Any) -> None:
        """Nothing: an optimizer that has not stepped keeps an empty state."""

    return init


def _flat_keys_with_slashes(original: Fn) -> Fn:
    def flatten(state_dict: dict[str, Any]) -> dict[str, Any]:
        return {key.replace(".", "/", 1): value for key, value in original(state_dict).items()}

    return flatten


def _strict_ignores_unexpected(original: Fn) -> Fn:
    def load(model: Any, state_dict: dict[str, Any], info: Any) -> Any:
        if not info.strict:
            return original(model, state_dict, info)
        with _changed(info, strict=False):
            keys = original(model, state_dict, info)
        if keys.missing_keys:
            raise RuntimeError(f"Missing key(s) in state_dict: {keys.missing_keys}")
        return _IncompatibleKeys(keys.missing_keys, [])

    return load


def _non_persistent_buffers_bumped(original: Fn) -> Fn:
    def get(model: Any, info: Any) -> Any:
        state_dict = original(model, info)
        with torch.no_grad():
            for module in model.modules():
                for name in module._non_persistent_buffers_set:
                    buffer = module._buffers.get(name)
                    if buffer is not None:
                        buffer.add_(1)
        return state_dict

    return get


def _frozen_unfrozen_on_load(original: Fn) -> Fn:
    def load(model: Any, state_dict: Any, info: Any) -> Any:
        result = original(model, state_dict, info)
        for param in model.parameters():
            param.requires_grad_(True)
        return result

    return load


def _param_groups_consumed(original: Fn) -> Fn:
    def load(model: Any, optimizers: Any, state_dict: Any, info: Any) -> None:
        original(model, optimizers, state_dict, info)
        state_dict.pop("param_groups", None)  # a nested state dict's; a flattened one keeps its

    return load


def _missing_state_unnamed(original: Fn) -> Fn:
    def split(*args: Any) -> Any:
        try:
            return original(*args)
        except RuntimeError as error:
            if "Missing optimizer state" not in str(error):
                raise
            raise RuntimeError("Missing optimizer state in checkpoint.") from None

    return split


def _persistent_buffers_on_meta(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str]]:
    return [
        (module, name)
        for module in model.modules()
        for name, buffer in module._buffers.items()
        if buffer is not None and buffer.is_meta and name not in module._non_persistent_buffers_set
    ]


def _meta_buffer_left_on_meta(original: Fn) -> Fn:
    def load(model: torch.nn.Module, state_dict: Any, info: Any) -> Any:
        left = _persistent_buffers_on_meta(model)[:1]
        result = original(model, state_dict, info)
        for module, name in left:
            loaded = module._buffers[name]
            if loaded is not None:
                module._buffers[name] = torch.empty_like(loaded, device="meta")
        return result

    return load


def _list_positions(model: torch.nn.Module) -> dict[str, str]:
    """Key prefixes of the entries of ``model``'s module lists that hold other ranks' entries
    (``None``), each with the prefix of its position among the entries this rank holds."""
    renames = {}
    for path, module in model.named_modules():
        if not isinstance(module, torch.nn.ModuleList):
            continue
        held = [name for name, child in module._modules.items() if child is not None]
        if len(held) == len(module._modules):
            continue
        for position, name in enumerate(held):
            renames[f"{path}.{name}." if path else f"{name}."] = (
                f"{path}.{position}." if path else f"{position}."
            )
    return renames


def _renumbered_by_local_position(original: Fn) -> Fn:
    def get(model: torch.nn.Module, info: Any) -> Any:
        state = original(model, info)
        renames = _list_positions(model)
        renamed = {}
        for key, value in state.items():
            prefix = next((old for old in renames if key.startswith(old)), None)
            renamed[key if prefix is None else renames[prefix] + key[len(prefix) :]] = value
        return renamed

    return get


def _groups_keep_compile_prefix(original: Fn) -> Fn:
    """FSDP's optimizer state keeps ``_orig_mod.`` in its param groups' parameters (nested)
    or in its ``param_groups.`` keys (flattened); its state's keys lose it as before."""

    def get(model: Any, optimizers: Any, info: Any) -> Any:
        result = original(model, optimizers, info)
        if not info.fsdp_modules or not result:
            return result
        from torch.distributed.checkpoint import state_dict as upstream

        compiled = {
            name.replace("_orig_mod.", ""): name
            for key, _ in model.named_parameters()
            for name in upstream._get_fqns(model, key, skip_compiler_prefix=False)
            if "_orig_mod." in name
        }
        if "param_groups" in result:
            for group in result["param_groups"]:
                group["params"] = [compiled.get(name, name) for name in group["params"]]
            return result
        return {_with_compiled_group_key(key, compiled): value for key, value in result.items()}

    return get


def _with_compiled_group_key(key: str, compiled: dict[str, str]) -> str:
    """A flattened ``param_groups.<fqn>.<hyper-parameter>`` key with ``fqn`` renamed."""
    if not key.startswith("param_groups."):
        return key
    fqn, _, entry = key.removeprefix("param_groups.").rpartition(".")
    return f"param_groups.{compiled.get(fqn, fqn)}.{entry}"


_mutant = mutant_maker(CHECKPOINT_STATE_DICT, GET_SET, MODELS, FULL, FAILURES)

MUTANTS = [
    _mutant(
        "fqn_modifiers_unread",
        "_iterate_valid_model_state",
        "a module's `_fqn_modifiers` are never read: a key its state-dict hooks rename cannot "
        "be matched to the attribute it lives in, and its loads miss that key",
        _fqn_modifiers_unread,
        "conformance/checks/test_renamed_keys.py",
    ),
    _mutant(
        "ddp_prefix_kept",
        "_get_fqns",
        "the `module.` prefix of DDP is not stripped from FQNs",
        _fqns_keeping("skip_ddp_prefix"),
    ),
    _mutant(
        "compile_prefix_kept",
        "_get_fqns",
        "the `_orig_mod.` prefix of torch.compile is not stripped from FQNs",
        _fqns_keeping("skip_compiler_prefix"),
        MODELS,
    ),
    _mutant(
        "compile_prefix_stripped_at_the_top_only",
        "_get_fqns",
        "`_orig_mod.` is stripped where the whole model was compiled but kept where its blocks "
        "were compiled before wrapping (`fc1._orig_mod.weight`), which only a model compiled "
        "block by block shows",
        _compile_prefix_stripped_at_the_top_only,
        "conformance/checks/test_compiled_models.py::"
        "test_a_compiled_models_state_dict_is_canonical_and_set_then_get_gives_it_back"
        "[w2-mlp_compiled_blocks-fsdp2]",
        MODELS,
    ),
    _mutant(
        "ignore_frozen_params_ignored",
        "_get_model_state_dict",
        "ignore_frozen_params=True still saves frozen parameters",
        _frozen_params_kept,
        MODELS,
    ),
    _mutant(
        "full_offloaded_state_dict_on_every_rank",
        "_maybe_full_or_cpu_state_dict",
        "full_state_dict with cpu_offload keeps the result on every rank, not rank 0 only",
        _full_offloaded_on_every_rank,
    ),
    _mutant(
        "full_offloaded_state_dict_gathered_on_every_rank",
        "_maybe_full_or_cpu_state_dict",
        "full_state_dict with cpu_offload gathers the whole state dict on every rank and "
        "drops it off rank 0 at the end: the right values, a whole model on every rank",
        _full_offloaded_gathered_everywhere,
        PEAK_MEMORY,
    ),
    _mutant(
        "extra_state_dropped",
        "_get_model_state_dict",
        "a module's get_extra_state is left out of the model state dict",
        _without_keys(_is_extra_state),
        MODELS,
    ),
    _mutant(
        "shared_parameter_saved_under_one_fqn",
        "_get_model_state_dict",
        "a tied parameter is saved under its first FQN only",
        _without_keys(_is_a_second_name),
        MODELS,
    ),
    _mutant(
        "model_read_bumps_non_persistent_buffers",
        "_get_model_state_dict",
        "reading the model's state dict adds 1 to its non-persistent buffers, which no state "
        "dict holds: only a training trajectory shows it",
        _non_persistent_buffers_bumped,
        OBSERVING,
    ),
    _mutant(
        "param_groups_reversed_on_get",
        "_get_optim_state_dict",
        "param groups are returned in the reverse order",
        _groups_reversed,
    ),
    _mutant(
        "step_dropped_on_get",
        "_get_optim_state_dict",
        "each parameter's optimizer `step` is left out",
        _step_dropped,
    ),
    _mutant(
        "optimizer_lazy_init_skipped",
        "_init_optim_state",
        "an optimizer that has not stepped yet is saved with empty state",
        _no_lazy_init,
    ),
    _mutant(
        "flattened_optimizer_keys_joined_with_a_slash",
        "_flatten_optim_state_dict",
        "flattened optimizer keys are joined as 'state/fqn.name' instead of 'state.fqn.name'",
        _flat_keys_with_slashes,
    ),
    _mutant(
        "param_groups_reversed_on_load",
        "_split_optim_state_dict",
        "saved param groups are mapped onto the optimizer's groups in the reverse order",
        _groups_reversed,
    ),
    _mutant(
        "first_parameters_state_dropped_on_load",
        "_split_optim_state_dict",
        "the first parameter's saved optimizer state is not loaded",
        _first_state_dropped,
    ),
    _mutant(
        "frozen_parameters_state_dropped_on_load",
        "_split_optim_state_dict",
        "the saved optimizer state of frozen parameters is not loaded",
        _frozen_state_dropped,
        equivalent=(
            "torch 2.13 already behaves so (pytorch#192202): "
            "test_upstream_failures.py::test_frozen_parameters_keep_their_optimizer_state_on_load "
            "fails on the unmutated build and is a known failure in its manifest"
        ),
    ),
    _mutant(
        "frozen_parameters_unfrozen_on_load",
        "_load_model_state_dict",
        "loading a model state dict leaves every parameter requiring gradients, as re-created "
        "nn.Parameters do: a frozen layer trains after a resume, which only a resumed training "
        "trajectory shows",
        _frozen_unfrozen_on_load,
        RESUMING,
    ),
    _mutant(
        "optimizer_load_consumes_its_param_groups",
        "_load_optim_state_dict",
        "loading a nested optimizer state dict pops its param groups from the caller's dict: "
        "the load itself is right, loading the same dict again is not, which only a check of "
        "what loads do to their inputs shows",
        _param_groups_consumed,
        LOADING,
    ),
    _mutant(
        "missing_optimizer_state_unnamed",
        "_split_optim_state_dict",
        "a strict load still refuses a parameter's missing optimizer state, but its error no "
        "longer names the parameter, which only a check of what errors say shows",
        _missing_state_unnamed,
        MALFORMED,
    ),
    _mutant(
        "meta_model_load_leaves_a_buffer_on_meta",
        "_load_model_state_dict",
        "a full load into a model built on meta assigns every parameter but leaves its first "
        "persistent buffer on meta, which only a load into a model on meta shows",
        _meta_buffer_left_on_meta,
        META_LOADS,
    ),
    _mutant(
        "list_entries_renumbered_by_local_position",
        "_get_model_state_dict",
        "on a rank that holds some entries of a module list alone (its experts, its pipeline "
        "stage's layers), each entry's keys are numbered by its position among the entries the "
        "rank holds: the values are right, the names of the whole model are not (experts.1 is "
        "saved as experts.0), which only a cell of such ranks shows",
        _renumbered_by_local_position,
        "conformance/checks/test_expert_parallel.py",
    ),
    _mutant(
        "strict_load_ignores_unexpected_keys",
        "_load_model_state_dict",
        "strict loading raises on missing keys but accepts unexpected ones",
        _strict_ignores_unexpected,
    ),
    _mutant(
        "optimizer_groups_keep_compile_prefix",
        "_get_optim_state_dict",
        "FSDP1's optimizer state dict strips torch.compile's `_orig_mod.` from its state's keys "
        "but not from its param groups' parameters: a load of it still finds every parameter, "
        "only the names differ from one process's, which only a compiled model shows",
        _groups_keep_compile_prefix,
        "conformance/checks/test_compiled_models.py::"
        "test_a_compiled_models_state_dict_is_canonical_and_set_then_get_gives_it_back"
        "[w2-mlp_compiled_blocks-fsdp1_full_shard_orig]",
        MODELS,
    ),
]
