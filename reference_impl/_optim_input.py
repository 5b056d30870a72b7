"""Checks of an optimizer state dict given to a load, each naming the key it finds wrong.

Upstream's loads accept some malformed inputs silently or fail later without a key (see
``conformance/checks/test_malformed_loads_name_the_key.py``); the oracle follows the contract a user
relies on instead: a strict load refuses, before anything is loaded and alike on every rank,
state for a parameter the model does not have, a parameter's state without an entry its
optimizer keeps, and a tensor entry of another shape than the optimizer keeps.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from reference_impl._flat_layout import flat_param_shards
from reference_impl._fqn import ModelNames

StateDict = dict[str, Any]
STATE = "state"
PARAM_GROUPS = "param_groups"
PARAMS = "params"


def parameter_fqns(model: nn.Module, names: ModelNames) -> set[str]:
    """Every FQN under which the model registers a parameter."""
    return {fqn for param in model.parameters() for fqn in names.fqns_of(param)}


def require_known_parameters(state_dict: StateDict, known: set[str]) -> None:
    """A nested or flattened optimizer state dict names only parameters in ``known``."""
    unknown = sorted(set(_named_parameters(state_dict, known)) - known)
    if unknown:
        raise RuntimeError(
            f"optimizer state for {', '.join(unknown)}: no such parameter in the model "
            "(load with strict=False to ignore it)"
        )


def _named_parameters(state_dict: StateDict, known: set[str]) -> Iterable[str]:
    if STATE in state_dict:
        yield from state_dict[STATE]
        for group in state_dict[PARAM_GROUPS]:
            yield from group[PARAMS]
        return
    for key in state_dict:
        section, _, rest = key.partition(".")
        if section in (STATE, PARAM_GROUPS):
            yield _parameter_of(rest, known)


def _parameter_of(rest: str, known: set[str]) -> str:
    """The parameter a flattened key's ``<fqn>.<entry>`` names: the longest known FQN it
    starts with, or all but its last segment when it starts with none."""
    matches = [fqn for fqn in known if rest.startswith(f"{fqn}.")]
    return max(matches, key=len) if matches else rest.rpartition(".")[0]


def require_complete_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    own: StateDict,
    names: ModelNames,
    strict: bool,
) -> None:
    """Each parameter's state in the nested, FQN-keyed ``own`` has the tensor shapes the
    optimizer keeps for it and, with ``strict``, every entry it keeps.

    Under FSDP1 what it keeps is decided by the flat parameter, the same on every rank: its
    original parameters' saved states have the same entries, and tensors shaped as the
    original parameter. Elsewhere every rank holds state for each of its parameters: each
    entry it holds now, with the same (global) shape.
    """
    fsdp1 = _fsdp1_parameters(model)
    if fsdp1 and strict:
        _require_uniform_entries(own[STATE], fsdp1)
    for param in (p for group in optimizer.param_groups for p in group[PARAMS]):
        for fqn in names.fqns_of(param):
            saved = own[STATE].get(fqn)
            if saved is None or fqn in fsdp1:
                continue
            for entry, value in optimizer.state.get(param, {}).items():
                if entry not in saved and strict:
                    raise KeyError(f"state.{fqn}.{entry}: missing from the optimizer state dict")
                _require_shape(f"state.{fqn}.{entry}", saved.get(entry), _global_shape(value))
    for fqn, (shape, _) in fsdp1.items():
        for entry, value in own[STATE].get(fqn, {}).items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                _require_shape(f"state.{fqn}.{entry}", value, shape)


def _fsdp1_parameters(model: nn.Module) -> dict[str, tuple[torch.Size, int]]:
    """Each FSDP1 original parameter's FQN: its shape and which flat parameter holds it."""
    return {
        fqn: (segment.shape, index)
        for index, shard in enumerate(flat_param_shards(model))
        for fqn, segment in zip(shard.fqns, shard.layout.segments, strict=True)
    }


def _require_uniform_entries(state: StateDict, fsdp1: dict[str, tuple[torch.Size, int]]) -> None:
    by_flat: dict[int, dict[str, set[str]]] = {}
    for fqn, (_, index) in fsdp1.items():
        if fqn in state:
            by_flat.setdefault(index, {})[fqn] = set(state[fqn])
    for entries in by_flat.values():
        every = set().union(*entries.values())
        for fqn, held in sorted(entries.items()):
            for entry in sorted(every - held):
                raise KeyError(
                    f"state.{fqn}.{entry}: missing from the optimizer state dict, which has it "
                    "for the other parameters FSDP1 flattens with this one"
                )


def _global_shape(value: Any) -> torch.Size | None:
    """A tensor's shape across ranks (a DTensor's or ShardedTensor's whole); None for
    scalars and non-tensors, whose shape is not checked."""
    if not isinstance(value, torch.Tensor) or value.dim() == 0:
        return None
    return value.size()


def _require_shape(key: str, value: Any, shape: torch.Size | None) -> None:
    if shape is None or not isinstance(value, torch.Tensor):
        return
    if value.size() != shape:
        raise ValueError(f"{key}: shape {list(value.size())}, the optimizer keeps {list(shape)}")
