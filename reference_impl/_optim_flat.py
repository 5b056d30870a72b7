"""Flattened optimizer state dicts: one level of dotted keys, for resharding across pipelines.

``{"state": {fqn: {"exp_avg": t}}, "param_groups": [{"lr": .1, "params": [fqn]}]}``
becomes ``{"state.fqn.exp_avg": t, "param_groups.fqn.lr": .1}``: state nests
to any depth, each group's hyper-parameters are repeated per parameter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

StateDict = dict[str, Any]
STATE = "state"
PARAM_GROUPS = "param_groups"
PARAMS = "params"


def flatten_optimizer_state_dict(state_dict: StateDict) -> StateDict:
    """Models ``_flatten_optim_state_dict``; the input is left unchanged.

    State leaves must be tensors, ints or floats (``TypeError`` naming the key otherwise).
    """
    flat: StateDict = {}
    for fqn, state in state_dict[STATE].items():
        _flatten_into(flat, f"{STATE}.{fqn}", state)
    for group in state_dict[PARAM_GROUPS]:
        for fqn in group[PARAMS]:
            for name, value in group.items():
                if name != PARAMS:
                    flat[f"{PARAM_GROUPS}.{fqn}.{name}"] = value
    return flat


def _flatten_into(flat: StateDict, prefix: str, value: Any) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten_into(flat, f"{prefix}.{key}", item)
    elif isinstance(value, (torch.Tensor, int, float)):
        flat[prefix] = value
    else:
        raise TypeError(
            f"{prefix}: a flattened optimizer state holds tensors, ints and floats, "
            f"not {type(value).__qualname__}"
        )


def unflatten_optimizer_state_dict(
    optimizer: torch.optim.Optimizer,
    flat: StateDict,
    fqns_of: Callable[[torch.Tensor], list[str]],
    strict: bool,
) -> StateDict:
    """Models ``_unflatten_optim_state_dict``: the nested, FQN-keyed dict for ``optimizer``.

    The optimizer's current state names which entries each parameter has
    (nested entries come back as dicts with string keys). A shared parameter
    is named by whichever FQN the flat dict uses. A group takes the
    hyper-parameters saved for its parameters, which must agree; a group
    without parameters keeps its own. With ``strict``, an entry the
    optimizer has but the flat dict lacks is a ``KeyError`` naming it.
    """
    state: StateDict = {}
    groups: list[StateDict] = []
    for group in optimizer.param_groups:
        hyper = {name: value for name, value in group.items() if name != PARAMS}
        fqns: list[str] = []
        for param in group[PARAMS]:
            for fqn in _saved_names(fqns_of(param), hyper, flat):
                fqns.append(fqn)
                entries = _entries_of(flat, fqn, optimizer.state.get(param, {}), strict)
                if entries:  # as in the nested form: a parameter without state has no entry
                    state[fqn] = entries
        groups.append({**_saved_hyper_parameters(flat, fqns, hyper), PARAMS: fqns})
    return {STATE: state, PARAM_GROUPS: groups}


def _saved_names(fqns: list[str], hyper: StateDict, flat: StateDict) -> list[str]:
    if len(fqns) == 1:
        return fqns
    return [f for f in fqns if any(f"{PARAM_GROUPS}.{f}.{name}" in flat for name in hyper)]


def _entries_of(flat: StateDict, fqn: str, current: dict[str, Any], strict: bool) -> StateDict:
    entries: StateDict = {}
    for name in current:
        key = f"{STATE}.{fqn}.{name}"
        if key in flat:
            entries[name] = flat[key]
            continue
        nested = _nested(flat, f"{key}.")
        if nested:
            entries[name] = nested
        elif strict:
            raise KeyError(f"{key}: missing from the flattened optimizer state dict")
    return entries


def _nested(flat: StateDict, prefix: str) -> StateDict:
    """The flat keys under ``prefix`` rebuilt as nested dicts with string keys."""
    nested: StateDict = {}
    for key, value in flat.items():
        if not key.startswith(prefix):
            continue
        *parents, leaf = key[len(prefix) :].split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def _saved_hyper_parameters(flat: StateDict, fqns: list[str], current: StateDict) -> StateDict:
    if not fqns:
        return dict(current)
    chosen: StateDict = {}
    for name in current:
        values = {fqn: _required(flat, f"{PARAM_GROUPS}.{fqn}.{name}") for fqn in fqns}
        first = values[fqns[0]]
        for fqn, value in values.items():
            if _differ(value, first):
                raise ValueError(
                    f"{PARAM_GROUPS}.{fqn}.{name}: {value!r}, but {fqns[0]} of the same group "
                    f"has {first!r}"
                )
        chosen[name] = first
    return chosen


def _required(flat: StateDict, key: str) -> Any:
    if key not in flat:
        raise KeyError(f"{key}: missing from the flattened optimizer state dict")
    return flat[key]


def _differ(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return not (
            isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
        )
    return bool(a != b)
