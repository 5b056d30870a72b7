"""The torch build's functions under test, found by introspection.

A function missing from the build under test is a skip that says which
function and which torch, never an error.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import pytest
import torch

STATE_DICT_UTILS = "torch.distributed._state_dict_utils"
DSD = "torch.distributed.checkpoint.state_dict"
FSDP1 = "torch.distributed.fsdp"
_FSDP1_CLASS = "FullyShardedDataParallel"

# The torch APIs the gate exercises, as (module, dotted name): what ``python -m ci.probe``
# looks up in the build under test.
EXERCISED_APIS: tuple[tuple[str, str], ...] = (
    *(
        (STATE_DICT_UTILS, name)
        for name in (
            "_iterate_state_dict",
            "_gather_state_dict",
            "_offload_state_dict_to_cpu",
            "_copy_state_dict",
            "_create_cpu_state_dict",
            "_check_state_dict_similarity",
            "_broadcast_state_dict",
            "_distribute_state_dict",
            "_flatten_state_dict",
            "_unflatten_state_dict",
        )
    ),
    *(
        (DSD, name)
        for name in (
            "StateDictOptions",
            "get_model_state_dict",
            "get_optimizer_state_dict",
            "get_state_dict",
            "set_model_state_dict",
            "set_optimizer_state_dict",
            "set_state_dict",
        )
    ),
    *(
        (FSDP1, f"{_FSDP1_CLASS}.{name}")
        for name in (
            "state_dict_type",
            "optim_state_dict",
            "optim_state_dict_to_load",
            "full_optim_state_dict",
            "sharded_optim_state_dict",
            "shard_full_optim_state_dict",
            "scatter_full_optim_state_dict",
            "flatten_sharded_optim_state_dict",
            "rekey_optim_state_dict",
        )
    ),
    (FSDP1, "fully_shard"),
    ("torch.distributed.tensor.parallel", "parallelize_module"),
    ("torch.distributed.checkpoint", "save"),
    ("torch.distributed.checkpoint", "load"),
)


def lookup(module: str, name: str) -> Any:
    """``module.name`` (``name`` may be dotted) from the torch under test; raises
    ``ImportError`` or ``AttributeError`` when the build lacks it."""
    found: Any = importlib.import_module(module)
    for part in name.split("."):
        found = getattr(found, part)
    return found


def upstream(module: str, name: str) -> Callable[..., Any]:
    """``module.name`` from the torch under test, or skip naming what is missing."""
    if (module, name) not in EXERCISED_APIS:
        raise ValueError(f"{module}.{name} is not in EXERCISED_APIS: add it, for the probe")
    try:
        found = lookup(module, name)
    except (ImportError, AttributeError):
        pytest.skip(f"torch {torch.__version__} has no {module}.{name}")
    return found  # type: ignore[no-any-return]
