"""Re-keying an optimizer state dict between parameter IDs and parameter names (FQNs).

IDs are positions in the parameter order of an optimizer over the model
*without* FSDP1: the given optimizer's order (else ``model.parameters()``'),
with each FSDP1 flat parameter standing for its original parameters, in
flat order. So an FQN-keyed dict saved from a wrapped model re-keys to the
IDs an unwrapped model's optimizer loads, whatever wraps the model given.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import OptimStateKeyType

from reference_impl._flat_layout import flat_param_shards
from reference_impl._fqn import ModelNames
from reference_impl._optim_flat import PARAM_GROUPS, PARAMS, STATE, StateDict
from reference_impl._optim_keys import ParamKey, parameter_ids


def fsdp_rekey_optim_state_dict(
    optim_state_dict: StateDict,
    key_type: OptimStateKeyType,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
) -> StateDict:
    """Models ``FSDP.rekey_optim_state_dict``: the same state keyed by IDs or by FQNs.

    A dict already keyed as asked comes back as it is; otherwise state
    values are shared and param groups copied, their ``params`` sorted.
    ``ValueError`` for keys of mixed kinds or keys naming no parameter.
    """
    target = str if key_type == OptimStateKeyType.PARAM_NAME else int
    groups: list[dict[str, Any]] = optim_state_dict.get(PARAM_GROUPS, [])
    keys = [*optim_state_dict[STATE], *(key for group in groups for key in group[PARAMS])]
    kinds = {type(key) for key in keys}
    if len(kinds) > 1 or not kinds <= {int, str}:
        raise ValueError(f"parameter keys must be all IDs or all names, got {keys}")
    if kinds <= {target}:
        return optim_state_dict
    fqns = _fqns_in_optimizer_order(model, optimizer)
    new_keys: dict[ParamKey, ParamKey] = (
        dict(enumerate(fqns)) if target is str else {fqn: i for i, fqn in enumerate(fqns)}
    )

    def rekeyed(key: ParamKey) -> ParamKey:
        if key not in new_keys:
            raise ValueError(f"{key!r} names no parameter of the model and optimizer given")
        return new_keys[key]

    result: StateDict = {STATE: {rekeyed(k): v for k, v in optim_state_dict[STATE].items()}}
    if PARAM_GROUPS in optim_state_dict:
        result[PARAM_GROUPS] = [
            {**copy.deepcopy(group), PARAMS: sorted(rekeyed(k) for k in group[PARAMS])}
            for group in groups
        ]
    return result


def _fqns_in_optimizer_order(
    model: nn.Module, optimizer: torch.optim.Optimizer | None
) -> list[str]:
    names = ModelNames(model)
    originals = {id(shard.flat_param): shard.fqns for shard in flat_param_shards(model)}
    params = list(parameter_ids(optimizer)) if optimizer is not None else model.parameters()
    return [fqn for p in params for fqn in originals.get(id(p)) or [names.fqn_of_param(p)]]
