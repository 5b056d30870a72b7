"""What the FSDP1 tests share: the cells, the optimizer state-dict settings, name order,
the deprecated legacy APIs."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.distributed.fsdp import (
    FullOptimStateDictConfig,
    FullStateDictConfig,
    FullyShardedDataParallel,
    ShardedOptimStateDictConfig,
    ShardedStateDictConfig,
    StateDictType,
)

from conformance._parallelisms import PARALLELISMS

FSDP1_CELLS = sorted(name for name, cell in PARALLELISMS.items() if cell.fsdp1)

OPTIM_KINDS = ("full", "full_offloaded", "full_rank0_only", "sharded")


def optim_settings(kind: str) -> tuple[StateDictType, Any, Any]:
    """FSDP1's state-dict type and configs for one of ``OPTIM_KINDS``, made afresh: FSDP1
    writes into the configs it gets. Only ``full_offloaded`` offloads."""
    if kind == "sharded":
        return (
            StateDictType.SHARDED_STATE_DICT,
            ShardedStateDictConfig(),
            ShardedOptimStateDictConfig(offload_to_cpu=False),
        )
    if kind not in OPTIM_KINDS:
        raise ValueError(f"unknown FSDP1 optimizer state-dict kind {kind!r}")
    optim_config = FullOptimStateDictConfig(
        offload_to_cpu=kind == "full_offloaded", rank0_only=kind == "full_rank0_only"
    )
    return StateDictType.FULL_STATE_DICT, FullStateDictConfig(), optim_config


def under_optim_settings(model: Any, kind: str, call: Callable[[], Any]) -> Any:
    """``call()`` inside ``FSDP.state_dict_type(model, *optim_settings(kind))``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # NO_SHARD and the configs warn
        with FullyShardedDataParallel.state_dict_type(model, *optim_settings(kind)):
            return call()


def state_names_sorted(optim_state_dict: dict[str, Any]) -> dict[str, Any]:
    """Each parameter's state in name order. FSDP1 orders a flat parameter's by iterating a
    set and NO_SHARD's as the optimizer holds it: the order is not part of the contract.
    A dict without ``state`` (``{}`` off rank 0 under ``rank0_only``) is returned as it is."""
    if "state" not in optim_state_dict:
        return optim_state_dict
    state = {key: dict(sorted(entry.items())) for key, entry in optim_state_dict["state"].items()}
    return {**optim_state_dict, "state": state}


def keys_and_names_sorted(optim_state_dict: dict[str, Any]) -> dict[str, Any]:
    """``state_names_sorted`` with the parameters' entries in key order too: what an
    optimizer loads is matched to its parameters by key, so their order carries nothing."""
    named = state_names_sorted(optim_state_dict)
    if "state" not in named:
        return named
    by_key = sorted(named["state"].items(), key=lambda item: (type(item[0]).__name__, item[0]))
    return {**named, "state": dict(by_key)}


def legacy_api(name: str) -> Callable[..., Any]:
    """``FSDP.<name>`` with its deprecation warning silenced, or a skip naming what is missing."""
    function = getattr(FullyShardedDataParallel, name, None)
    if function is None:
        pytest.skip(f"torch {torch.__version__} has no FullyShardedDataParallel.{name}")

    def call(*args: Any, **kwargs: Any) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return function(*args, **kwargs)

    return call
