"""Models ``torch/distributed/checkpoint/state_dict.py``: one state dict for every parallelism.

Model and optimizer state dicts are keyed by canonical FQNs (``_fqn``),
whatever wraps the model: DDP, FSDP1, FSDP2, TP, ``torch.compile``,
activation checkpointing. The model's own ``state_dict``/``load_state_dict``
(for FSDP1, the oracle of its state-dict types, ``fsdp_state_dict_utils``)
produce and consume the parallelism's native values; FSDP1's optimizer
state is converted both ways by ``fsdp_optim_utils``. This module does what the upstream module adds
on top: naming, filtering, gathering, offloading, optimizer re-keying,
flattening, splitting among optimizers, broadcast and distribution of full
state dicts. Where upstream has a known bug, the oracle does what its
contract says (e.g. frozen parameters keep their optimizer state on load).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy, StateDictType

from reference_impl._devices import default_device
from reference_impl._fqn import ModelNames
from reference_impl._optim_flat import (
    PARAM_GROUPS,
    PARAMS,
    STATE,
    StateDict,
    flatten_optimizer_state_dict,
    unflatten_optimizer_state_dict,
)
from reference_impl._optim_input import (
    parameter_fqns,
    require_complete_state,
    require_known_parameters,
)
from reference_impl._tree_broadcast import broadcast_tree
from reference_impl.fsdp_optim_utils import fsdp_optim_state_dict, fsdp_optim_state_dict_to_load
from reference_impl.fsdp_state_dict_utils import (
    IncompatibleKeys,
    fsdp_load_state_dict,
    fsdp_state_dict,
)
from reference_impl.state_dict_utils import (
    broadcast_state_dict,
    distribute_state_dict,
    flatten_state_dict,
    gather_state_dict,
    offload_state_dict_to_cpu,
    unflatten_state_dict,
)

Optimizers = torch.optim.Optimizer | Iterable[torch.optim.Optimizer]


@dataclass(frozen=True)
class StateDictOptions:
    """Models upstream ``StateDictOptions``; every field has upstream's meaning and default.

    Validated on construction: ``broadcast_from_rank0`` needs ``full_state_dict``.
    """

    full_state_dict: bool = False
    cpu_offload: bool = False
    ignore_frozen_params: bool = False
    keep_submodule_prefixes: bool = True
    strict: bool = True
    broadcast_from_rank0: bool = False
    flatten_optimizer_state_dict: bool = False
    dsd_fqn_modifiers: str = "_fqn_modifiers"

    def __post_init__(self) -> None:
        if self.broadcast_from_rank0 and not self.full_state_dict:
            raise ValueError("broadcast_from_rank0 needs full_state_dict=True")


# ----- options and checks ------------------------------------------------------


def _options(options: StateDictOptions | None) -> StateDictOptions:
    return options if options is not None else StateDictOptions()


def _optimizers(optimizers: Optimizers) -> tuple[torch.optim.Optimizer, ...]:
    found = (optimizers,) if isinstance(optimizers, torch.optim.Optimizer) else tuple(optimizers)
    if not found:
        raise RuntimeError("no optimizer given for an optimizer state dict")
    return found


def _require_model_state(state: StateDict, options: StateDictOptions, submodules: bool) -> None:
    """Refuse an empty model state dict where the options promise or need one."""
    may_be_empty = (
        submodules
        or options.ignore_frozen_params
        or (options.cpu_offload and options.full_state_dict)
        or not options.strict
        or options.broadcast_from_rank0
    )
    if not state and not may_be_empty:
        raise RuntimeError(
            f"rank {_rank()}: the model state dict is empty, but these options need one: {options}"
        )
    for key in state:
        if "_flat_param" in key:
            raise RuntimeError(
                f"{key}: an FSDP1 flat parameter's name; is the model the root module?"
            )


def _require_optimizer_state(state: StateDict, options: StateDictOptions) -> None:
    may_be_empty = (options.cpu_offload and options.full_state_dict) or options.broadcast_from_rank0
    if not state and not may_be_empty:
        raise RuntimeError(
            f"rank {_rank()}: the optimizer state dict is empty, but these options need one: "
            f"{options}"
        )


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


# ----- FSDP1: the oracle of its state-dict types produces the native values --------


def _has_fsdp1(model: nn.Module) -> bool:
    return any(isinstance(m, FullyShardedDataParallel) for m in model.modules())


_HYBRID = (ShardingStrategy.HYBRID_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2)


def _fsdp1_group(model: nn.Module) -> dist.ProcessGroup | None:
    """The group FSDP1's optimizer conversions and the model load's agreement run in, as
    upstream picks it: the first FSDP1 module's process group, or the world (None) where it
    shards hybrid."""
    first = FullyShardedDataParallel.fsdp_modules(model)[0]
    return None if first.sharding_strategy in _HYBRID else first.process_group


def _fsdp1_type(full: bool) -> StateDictType:
    """FULL (gathered everywhere, on device) or SHARDED; the oracle offloads and filters after."""
    return StateDictType.FULL_STATE_DICT if full else StateDictType.SHARDED_STATE_DICT


# ----- results: gathered, offloaded -------------------------------------------------


def _finished(state: StateDict, options: StateDictOptions) -> StateDict:
    """Gather to full tensors (rank 0 only when offloading) or offload, as the options say."""
    if options.full_state_dict:
        ranks_only = (0,) if options.cpu_offload and dist.is_initialized() else ()
        return gather_state_dict(state, cpu_offload=options.cpu_offload, ranks_only=ranks_only)
    if options.cpu_offload:
        return offload_state_dict_to_cpu(state)
    return state


# ----- model ---------------------------------------------------------------------------


@torch.no_grad()
def get_model_state_dict(
    model: nn.Module,
    *,
    submodules: set[nn.Module] | None = None,
    options: StateDictOptions | None = None,
) -> StateDict:
    """Models ``get_model_state_dict``: the model's state keyed by canonical FQNs.

    Frozen parameters are left out with ``ignore_frozen_params``; with
    ``submodules`` only their state is kept (prefixes kept or cut by
    ``keep_submodule_prefixes``); then gathered or offloaded per the options.
    """
    options = _options(options)
    names = ModelNames(model, options.dsd_fqn_modifiers)
    if _has_fsdp1(model):
        native = fsdp_state_dict(model, _fsdp1_type(options.full_state_dict))
    else:
        native = model.state_dict()
    state = {names.fqn_of_key(key): value for key, value in native.items()}
    if submodules:
        state = _of_submodules(names, state, submodules, options.keep_submodule_prefixes)
    if options.ignore_frozen_params:
        for param in model.parameters():
            if not param.requires_grad:
                for fqn in names.fqns_of(param):
                    state.pop(fqn, None)
    result = _finished(state, options)
    _require_model_state(result, options, submodules=bool(submodules))
    return result


def _of_submodules(
    names: ModelNames, state: StateDict, submodules: set[nn.Module], keep_prefixes: bool
) -> StateDict:
    """The state under each submodule's canonical FQN, with that prefix kept or cut."""
    prefixes = {f"{names.fqn_of_module(module)}." for module in submodules}
    result: StateDict = {}
    for fqn, value in state.items():
        for prefix in prefixes:
            if fqn.startswith(prefix):
                result[fqn if keep_prefixes else fqn[len(prefix) :]] = value
    return result


@torch.no_grad()
def set_model_state_dict(
    model: nn.Module, model_state_dict: StateDict, *, options: StateDictOptions | None = None
) -> IncompatibleKeys:
    """Models ``set_model_state_dict``: load FQN-keyed state, full or sharded, into ``model``.

    A full state dict is distributed into the model's shards; with
    ``broadcast_from_rank0`` only rank 0's dict is read and the others may
    pass ``{}``. The caller's dict is never changed. With ``strict``, a
    missing FQN raises before anything is loaded; under ``broadcast_from_rank0``
    it raises after the broadcast, on every rank (a check on rank 0 alone
    would leave the others waiting in the broadcast).
    """
    options = _options(options)
    _require_model_state(model_state_dict, options, submodules=False)
    if not model_state_dict and not options.broadcast_from_rank0:
        return IncompatibleKeys([], [])
    names = ModelNames(model, options.dsd_fqn_modifiers)
    given = model_state_dict if not options.broadcast_from_rank0 or dist.get_rank() == 0 else {}
    if options.strict and not options.broadcast_from_rank0:
        missing = [e.fqn for e in names.entries if e.fqn not in given]
        if missing:
            raise RuntimeError(f"rank {_rank()}: missing keys in the model state dict: {missing}")
    native = {names.key_of(fqn) or fqn: value for fqn, value in given.items()}
    assign = False
    if options.full_state_dict:
        native, assign = _localised(native, names, options)
    if _has_fsdp1(model):
        return fsdp_load_state_dict(
            model,
            native,
            _fsdp1_type(options.full_state_dict),
            strict=options.strict,
            group=_fsdp1_group(model),
        )
    result = model.load_state_dict(native, strict=options.strict, assign=assign)
    # Reported by canonical FQN, as every key of this API is (a wrapper's ``module.`` is not
    # the caller's name for it); unexpected keys are the caller's own.
    missing = [names.fqn_of_key(key) for key in result.missing_keys]
    return IncompatibleKeys(missing, list(result.unexpected_keys))


def _localised(
    full: StateDict, names: ModelNames, options: StateDictOptions
) -> tuple[StateDict, bool]:
    """Full values replaced by this rank's pieces, shaped like the model's own state.

    Returns the state to load and whether it must be assigned (the model is on meta).
    """
    local: StateDict = {e.key: e.value for e in names.entries}
    tensors = [v for v in local.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
    devices = {v.device for v in tensors}
    on_meta = torch.device("meta") in devices
    devices.discard(torch.device("meta"))
    if len(devices) > 1:
        raise ValueError(f"the model's state lies on several devices: {sorted(map(str, devices))}")
    device = devices.pop() if devices else default_device()
    if options.broadcast_from_rank0:
        broadcast_state_dict(
            full, local, device=device, strict=options.strict, cpu_offload=options.cpu_offload
        )
    else:
        distribute_state_dict(full, local, device=device)
    loaded = {**full, **{k: v for k, v in local.items() if v is not None}}
    return loaded, on_meta


# ----- optimizer -----------------------------------------------------------------------


def ensure_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Models ``_init_optim_state`` as its contract reads: create missing optimizer state by a
    zero-lr, zero-grad step, leaving training as it was.

    Only an optimizer with no state at all is stepped; it must have no
    gradients (a step would apply them): the oracle refuses that loudly.
    Upstream's step also counts itself: Adam's ``step`` becomes 1, and the
    first real update then uses the second step's bias correction
    (pytorch#164929). The oracle sets each created step counter back to zero,
    the state a fresh optimizer creates at its first step.
    """
    if optimizer.state:
        return
    params = [p for group in optimizer.param_groups for p in group[PARAMS]]
    if any(p.grad is not None for p in params):
        raise RuntimeError(
            "the optimizer has no state yet but its parameters have gradients: step or clear "
            "them first (a zero-lr step to create the state would consume them)"
        )
    for param in params:
        if param.requires_grad:
            param.grad = torch.zeros_like(param)
    learning_rates = [(g, g["lr"]) for g in optimizer.param_groups if "lr" in g]
    for group, lr in learning_rates:
        group["lr"] = torch.tensor(0.0) if isinstance(lr, torch.Tensor) else 0.0
    try:
        optimizer.step()
    finally:
        for group, lr in learning_rates:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
    for state in optimizer.state.values():
        if "step" in state:
            state["step"] = _zero_like(state["step"])


def _zero_like(counter: Any) -> Any:
    """A step counter's zero, of the counter's own type (a tensor keeps dtype and device)."""
    return torch.zeros_like(counter) if isinstance(counter, torch.Tensor) else type(counter)(0)


def _fqn_keyed(optimizer: torch.optim.Optimizer, names: ModelNames) -> StateDict:
    """The optimizer's own state dict with parameter ids replaced by FQNs."""
    native = optimizer.state_dict()
    params = [p for group in optimizer.param_groups for p in group[PARAMS]]
    fqn_of_id = {index: names.fqn_of_param(param) for index, param in enumerate(params)}
    return {
        STATE: {fqn_of_id[index]: state for index, state in native[STATE].items()},
        PARAM_GROUPS: [
            {**group, PARAMS: [fqn_of_id[i] for i in group[PARAMS]]}
            for group in native[PARAM_GROUPS]
        ],
    }


def _fsdp1_fqn_keyed(model: nn.Module, optimizer: torch.optim.Optimizer, full: bool) -> StateDict:
    """FSDP1's flat or ``use_orig_params`` optimizer state, FQN-keyed by the oracle of it."""
    return fsdp_optim_state_dict(model, optimizer, shard_state=not full, group=_fsdp1_group(model))


@torch.no_grad()
def get_optimizer_state_dict(
    model: nn.Module,
    optimizers: Optimizers,
    *,
    submodules: set[nn.Module] | None = None,
    options: StateDictOptions | None = None,
) -> StateDict:
    """Models ``get_optimizer_state_dict``: every optimizer's state merged, keyed by FQN.

    Missing state is created first (``ensure_optimizer_state``); param groups
    list FQNs; ``flatten_optimizer_state_dict`` gives one level of keys;
    then gathered or offloaded per the options.
    """
    del submodules  # upstream accepts and ignores it for optimizers
    options = _options(options)
    optimizers = _optimizers(optimizers)
    names = ModelNames(model, options.dsd_fqn_modifiers)
    merged: StateDict = {STATE: {}, PARAM_GROUPS: []}
    for optimizer in optimizers:
        ensure_optimizer_state(optimizer)
        keyed = (
            _fsdp1_fqn_keyed(model, optimizer, options.full_state_dict)
            if _has_fsdp1(model)
            else _fqn_keyed(optimizer, names)
        )
        merged[STATE].update(keyed[STATE])
        merged[PARAM_GROUPS].extend(keyed[PARAM_GROUPS])
    if options.flatten_optimizer_state_dict:
        merged = flatten_optimizer_state_dict(merged)
    result = _finished(merged, options)
    _require_optimizer_state(result, options)
    return result


def _fqns_in_groups(groups: list[StateDict]) -> set[str]:
    return {fqn for group in groups for fqn in group[PARAMS]}


def split_optimizer_state_dict(
    optimizer: torch.optim.Optimizer, state_dict: StateDict, names: ModelNames, strict: bool
) -> StateDict:
    """Models ``_split_optim_state_dict``: the part of a merged FQN-keyed dict for ``optimizer``.

    A shared parameter is named by whichever of its FQNs the dict uses. Each
    of the optimizer's groups takes the hyper-parameters of the saved group
    holding its parameters; a group without parameters takes the one saved
    group without parameters. State of frozen parameters is kept when saved;
    with ``strict``, a parameter the optimizer holds state for but the dict
    does not is an error (stateless optimizers such as plain SGD hold none).
    """
    saved_state, saved_groups = state_dict[STATE], state_dict[PARAM_GROUPS]
    saved_fqns = _fqns_in_groups(saved_groups)
    state: StateDict = {}
    groups: list[StateDict] = []
    for group in optimizer.param_groups:
        fqns = [
            fqn for param in group[PARAMS] for fqn in _named_in(names.fqns_of(param), saved_fqns)
        ]
        source = _saved_group_of(fqns, saved_groups, optimizer)
        groups.append({**{k: v for k, v in source.items() if k != PARAMS}, PARAMS: fqns})
        for param in group[PARAMS]:
            for fqn in _named_in(names.fqns_of(param), saved_fqns):
                if fqn in saved_state:
                    state[fqn] = saved_state[fqn]
                elif strict and optimizer.state.get(param):
                    raise RuntimeError(
                        f"{fqn}: the optimizer holds state for this parameter but the state "
                        "dict has none (load with strict=False to allow it)"
                    )
    return {STATE: state, PARAM_GROUPS: groups}


def _named_in(fqns: list[str], saved: set[str]) -> list[str]:
    """The FQN a saved dict uses for a parameter: all of them if unshared, else those saved."""
    return fqns if len(fqns) == 1 else [fqn for fqn in fqns if fqn in saved]


def _saved_group_of(
    fqns: list[str], saved_groups: list[StateDict], optimizer: torch.optim.Optimizer
) -> StateDict:
    if fqns:
        for group in saved_groups:
            if fqns[0] in group[PARAMS]:
                return group
        raise KeyError(f"{fqns[0]}: in no param group of the optimizer state dict")
    empty = [group for group in saved_groups if not group[PARAMS]]
    if len(empty) != 1:
        raise ValueError(
            "the optimizer has a param group without parameters; the state dict must have "
            f"exactly one such group, it has {len(empty)}"
        )
    if len(saved_groups) != len(optimizer.param_groups):
        raise ValueError(
            "a param group without parameters is matched only when the state dict holds "
            "this optimizer's groups alone"
        )
    return empty[0]


@torch.no_grad()
def set_optimizer_state_dict(
    model: nn.Module,
    optimizers: Optimizers,
    optim_state_dict: StateDict,
    *,
    options: StateDictOptions | None = None,
) -> None:
    """Models ``set_optimizer_state_dict``: load FQN-keyed (nested or flattened) state.

    Each optimizer takes its own parameters' part; a full state dict is
    distributed (or broadcast from rank 0) into the shards of the state the
    optimizer holds now.
    """
    options = _options(options)
    optimizers = _optimizers(optimizers)
    _require_optimizer_state(optim_state_dict, options)
    names = ModelNames(model, options.dsd_fqn_modifiers)
    held = parameter_fqns(model, names)
    if options.broadcast_from_rank0:
        optim_state_dict, options = _from_rank0(optim_state_dict, held, options, model)
    elif options.strict and optim_state_dict:
        require_known_parameters(optim_state_dict, held)
    for optimizer in optimizers:
        ensure_optimizer_state(optimizer)
        own = _own_part(optimizer, optim_state_dict, names, options.strict)
        if own:
            require_complete_state(model, optimizer, own, names, options.strict)
        if _has_fsdp1(model):
            own = fsdp_optim_state_dict_to_load(
                model,
                optimizer,
                own,
                rank0_only=options.broadcast_from_rank0,
                group=_fsdp1_group(model),
            )
        elif options.full_state_dict:
            own = _optimizer_localised(optimizer, own, names, options)
        optimizer.load_state_dict(own)


def _from_rank0(
    state_dict: StateDict, held: set[str], options: StateDictOptions, model: nn.Module
) -> tuple[StateDict, StateDictOptions]:
    """Rank 0's full optimizer state dict, checked against the parameters of every rank (a
    strict load of state for a parameter no rank holds raises on every rank), and the options
    to load it with.

    Where every rank holds the same parameters, rank 0's part of the dict is every rank's and
    the load broadcasts it. Where ranks hold different parameters (pipeline stages), each
    rank's part is its own: every rank receives rank 0's dict and loads its part as from a
    full dict given on every rank.
    """
    everywhere: list[set[str] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(everywhere, held)
    known = set().union(*(fqns or set() for fqns in everywhere))
    if options.strict:
        verdict = [_unknown_parameters(state_dict, known) if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(verdict, src=0)
        if verdict[0]:
            raise RuntimeError(verdict[0])
    if all(fqns == held for fqns in everywhere):
        return state_dict, options
    device = next(iter(model.parameters())).device
    whole = broadcast_tree(state_dict, device, group=None)
    return whole, replace(options, broadcast_from_rank0=False)


def _unknown_parameters(state_dict: StateDict, known: set[str]) -> str | None:
    """``require_known_parameters``'s error for ``state_dict``, or None."""
    try:
        require_known_parameters(state_dict, known)
    except RuntimeError as error:
        return str(error)
    return None


def _own_part(
    optimizer: torch.optim.Optimizer, state_dict: StateDict, names: ModelNames, strict: bool
) -> StateDict:
    if not state_dict:
        return {}
    if STATE in state_dict:
        return split_optimizer_state_dict(optimizer, state_dict, names, strict)
    return unflatten_optimizer_state_dict(optimizer, state_dict, names.fqns_of, strict)


def _optimizer_localised(
    optimizer: torch.optim.Optimizer,
    full: StateDict,
    names: ModelNames,
    options: StateDictOptions,
) -> StateDict:
    """The full optimizer state replaced by this rank's pieces of the state it holds now."""
    local = _fqn_keyed(optimizer, names)
    devices = {
        t.device
        for state in local[STATE].values()
        for t in state.values()
        if isinstance(t, torch.Tensor) and t.dim() > 0
    }
    if not devices:  # stateless, e.g. SGD without momentum: the parameters' device
        devices = {p.device for group in optimizer.param_groups for p in group[PARAMS]}
    if len(devices) != 1:
        raise ValueError(
            "the optimizer's state must lie on one device to be loaded from a full state "
            f"dict; it lies on {sorted(map(str, devices)) or 'none'}"
        )
    device = devices.pop()
    flat_full, full_paths = flatten_state_dict(full)
    flat_local, local_paths = flatten_state_dict(local)
    if options.broadcast_from_rank0:
        broadcast_state_dict(flat_full, flat_local, device=device)
    else:
        distribute_state_dict(flat_full, flat_local, device=device)
    for key, value in flat_full.items():
        if key not in flat_local:
            flat_local[key] = value
            local_paths[key] = full_paths[key]
    return unflatten_state_dict(flat_local, local_paths)


# ----- both ------------------------------------------------------------------------------


def get_state_dict(
    model: nn.Module,
    optimizers: Optimizers,
    *,
    submodules: set[nn.Module] | None = None,
    options: StateDictOptions | None = None,
) -> tuple[StateDict, StateDict]:
    """Models ``get_state_dict``: the model's and the optimizers' state dicts."""
    return (
        get_model_state_dict(model, submodules=submodules, options=options),
        get_optimizer_state_dict(model, optimizers, options=options),
    )


def set_state_dict(
    model: nn.Module,
    optimizers: Optimizers,
    *,
    model_state_dict: StateDict,
    optim_state_dict: StateDict,
    options: StateDictOptions | None = None,
) -> IncompatibleKeys:
    """Models ``set_state_dict``: load the optimizers' state, then the model's.

    An empty model state dict loads the optimizers only. With
    ``broadcast_from_rank0`` every rank loads the model too, whatever it
    passed: ranks other than 0 may pass empty dicts for both.
    """
    set_optimizer_state_dict(model, optimizers, optim_state_dict, options=options)
    if not model_state_dict and not _options(options).broadcast_from_rank0:
        return IncompatibleKeys([], [])
    return set_model_state_dict(model, model_state_dict, options=options)
