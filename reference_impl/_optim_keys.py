"""How an optimizer state dict names parameters: by position (IDs) or by name (NamedOptimizer).

``Optimizer.state_dict`` numbers the parameters of all its groups in order;
a NamedOptimizer-style optimizer (``torch.distributed.optim._NamedOptimizer``,
TorchRec's KeyedOptimizer) keys them by the name ``model.named_parameters()``
gives them (wrapper prefixes included). Both map back to parameters here.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from reference_impl._optim_flat import PARAMS, STATE, StateDict

ParamKey = int | str


def parameter_ids(optimizer: torch.optim.Optimizer) -> dict[torch.Tensor, int]:
    """``Optimizer.state_dict``'s IDs: positions in the param groups, in order."""
    params = [p for group in optimizer.param_groups for p in group[PARAMS]]
    return {param: index for index, param in enumerate(params)}


def parameter_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[torch.Tensor, str]:
    """NamedOptimizer keys: each optimizer parameter's first name in ``named_parameters()``."""
    first: dict[torch.Tensor, str] = {}
    for name, registered in model.named_parameters(remove_duplicate=False):
        first.setdefault(registered, name)
    keys: dict[torch.Tensor, str] = {}
    for param in parameter_ids(optimizer):
        if param not in first:
            raise ValueError(f"a parameter of shape {list(param.shape)} is not in the model")
        keys[param] = first[param]
    return keys


def is_named(optim_state_dict: StateDict) -> bool:
    """Whether the state is keyed by names (a NamedOptimizer's), judged by its first key."""
    state: dict[Any, Any] = optim_state_dict.get(STATE) or {}
    return bool(state) and isinstance(next(iter(state)), str)


def parameter_keys(
    model: nn.Module, optimizer: torch.optim.Optimizer, named: bool
) -> dict[torch.Tensor, ParamKey]:
    """Each optimizer parameter's key in its state dict: its name if ``named``, else its ID."""
    if named:
        return dict(parameter_names(model, optimizer))
    return dict(parameter_ids(optimizer))
