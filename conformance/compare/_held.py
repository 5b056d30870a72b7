"""Models of which each rank holds a part alone: pipeline stages
(``conformance/cells/_pipeline.py``) and experts (``conformance/cells/_experts.py``).

A part is a set of names (submodules, buffers, ``experts.<i>``) set on the rank's model under
``HELD``; the rank's state dicts hold the keys under those names alone, under the whole
model's names. What every check needs of such a cell: which keys a rank holds, its part of a
whole-model dict, and the union of every rank's parts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.distributed as dist
from torch import nn

HELD = "_holds_part_of_the_model"  # the names a rank's part holds, set on its model


def holds_a_part(model: nn.Module) -> bool:
    """Whether ``model`` holds part of the model alone (a pipeline stage, a rank's experts)."""
    return getattr(model, HELD, None) is not None


def holds(model: nn.Module) -> Callable[[str], bool]:
    """Whether ``model`` (a part, or any other model: all) holds the state of a key path."""
    held: tuple[str, ...] | None = getattr(model, HELD, None)
    if held is None:
        return lambda _: True
    return lambda key: any(key == name or key.startswith(f"{name}.") for name in held)


def held_part(tree: dict[str, Any], model: nn.Module) -> dict[str, Any]:
    """The entries of a dict keyed by key path that ``model`` holds (``holds``)."""
    held = holds(model)
    return {key: value for key, value in tree.items() if held(key)}


def every_rank(value: Any, group: dist.ProcessGroup | None = None) -> list[Any]:
    """``value`` of every rank of ``group``, by rank. Collective."""
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, value, group=group)
    return gathered


def _union(parts: list[dict[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            merged.setdefault(key, value)
    return merged


def whole_model_state(
    state: dict[str, Any], group: dist.ProcessGroup | None = None
) -> dict[str, Any]:
    """The union of the full model state dicts of every rank of ``group``: the whole model's
    where each rank holds a part, ``state`` itself where every rank holds the whole
    model. Collective."""
    return _union(every_rank(state, group))


def whole_optimizer_state(
    state: dict[str, Any], group: dist.ProcessGroup | None = None
) -> dict[str, Any]:
    """The union of the full (nested) optimizer state dicts of every rank of ``group``
    (``whole_model_state``): the state of every parameter, and each param group with the
    names every part gives it. Collective."""
    parts = every_rank(state, group)
    groups = []
    for index, group_state in enumerate(state["param_groups"]):
        names: list[str] = []
        for part in parts:
            names += [n for n in part["param_groups"][index]["params"] if n not in names]
        groups.append({**group_state, "params": names})
    return {"state": _union([part["state"] for part in parts]), "param_groups": groups}
