"""What the FSDP1 tests share: the cells, the model and optimizer state-dict settings of each
kind, name order, the deprecated legacy APIs, a state dict through ``torch.save``."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import torch

import reference_impl as ri
from conformance._upstream import fsdp, quiet_deprecations
from conformance.cells import PARALLELISMS

FSDP1_CELLS = sorted(name for name, cell in PARALLELISMS.items() if cell.fsdp1)

OPTIM_KINDS = ("full", "full_offloaded", "full_rank0_only", "sharded")
# Each of ``OPTIM_KINDS`` as the options of the oracle's ``fsdp_optim_state_dict``.
OPTIM_ORACLE_OPTIONS: dict[str, dict[str, bool]] = {
    "full": {},
    "full_rank0_only": {"rank0_only": True},
    "full_offloaded": {"cpu_offload": True},
    "sharded": {"shard_state": True},
}
MODEL_KINDS = (
    "full",
    "full_rank0_only",
    "local",
    "local_offloaded",
    "sharded",
    "sharded_offloaded",
)


def model_settings(kind: str, device: Any = None) -> tuple[Any, Any]:
    """FSDP1's state-dict type and config for one of ``MODEL_KINDS``, the config made afresh
    (FSDP1 writes into the configs it gets). ``full_rank0_only`` also offloads where
    ``device`` is an accelerator, as upstream's tests couple the two."""
    if kind not in MODEL_KINDS:
        raise ValueError(f"unknown FSDP1 model state-dict kind {kind!r}")
    base, _, offloaded = kind.partition("_")
    if base == "full":
        offload = offloaded == "rank0_only" and device is not None and device.type != "cpu"
        return fsdp.StateDictType.FULL_STATE_DICT, fsdp.FullStateDictConfig(
            rank0_only=offloaded == "rank0_only", offload_to_cpu=offload
        )
    config = fsdp.ShardedStateDictConfig if base == "sharded" else fsdp.LocalStateDictConfig
    state_dict_type = getattr(fsdp.StateDictType, f"{base.upper()}_STATE_DICT")
    return state_dict_type, config(offload_to_cpu=offloaded == "offloaded")


def torch_model_state_dict(model: Any, kind: str, device: Any = None, prefix: str = "") -> Any:
    """``model.state_dict(prefix=prefix)`` inside ``FSDP.state_dict_type`` for ``kind``."""
    settings = model_settings(kind, device)
    with quiet_deprecations(), fsdp.FullyShardedDataParallel.state_dict_type(model, *settings):
        return dict(model.state_dict(prefix=prefix))


def torch_model_load(model: Any, state_dict: dict[str, Any], kind: str) -> Any:
    """``model.load_state_dict`` inside ``FSDP.state_dict_type`` with ``kind``'s type and
    default config (the model knows its process group)."""
    state_dict_type, _ = model_settings(kind)
    with (
        quiet_deprecations(),
        fsdp.FullyShardedDataParallel.state_dict_type(model, state_dict_type),
    ):
        return model.load_state_dict(state_dict)


def oracle_model_state_dict(model: Any, kind: str, device: Any = None) -> dict[str, Any]:
    """The oracle's ``fsdp_state_dict`` for ``kind``: the counterpart of
    ``torch_model_state_dict``."""
    return ri.fsdp_state_dict(model, *model_settings(kind, device))


def optim_settings(kind: str) -> tuple[fsdp.StateDictType, Any, Any]:
    """FSDP1's state-dict type and configs for one of ``OPTIM_KINDS``, made afresh: FSDP1
    writes into the configs it gets. Only ``full_offloaded`` offloads."""
    if kind == "sharded":
        return (
            fsdp.StateDictType.SHARDED_STATE_DICT,
            fsdp.ShardedStateDictConfig(),
            fsdp.ShardedOptimStateDictConfig(offload_to_cpu=False),
        )
    if kind not in OPTIM_KINDS:
        raise ValueError(f"unknown FSDP1 optimizer state-dict kind {kind!r}")
    optim_config = fsdp.FullOptimStateDictConfig(
        offload_to_cpu=kind == "full_offloaded", rank0_only=kind == "full_rank0_only"
    )
    return fsdp.StateDictType.FULL_STATE_DICT, fsdp.FullStateDictConfig(), optim_config


def under_optim_settings(model: Any, kind: str, call: Callable[[], Any]) -> Any:
    """``call()`` inside ``FSDP.state_dict_type(model, *optim_settings(kind))``."""
    settings = optim_settings(kind)
    with quiet_deprecations(), fsdp.FullyShardedDataParallel.state_dict_type(model, *settings):
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


def fsdp1_api(name: str) -> Callable[..., Any]:
    """``FSDP.<name>`` (a static method) with its deprecation warning silenced, or a skip
    naming what is missing."""
    function = fsdp.get(f"FullyShardedDataParallel.{name}")

    def call(*args: Any, **kwargs: Any) -> Any:
        with quiet_deprecations():
            return function(*args, **kwargs)

    return call


def through_torch_save(state_dict: dict[str, Any]) -> dict[str, Any]:
    """``state_dict`` saved by ``torch.save`` and read back by ``torch.load`` (its
    ShardedTensors and DTensors pickled whole), as a user keeping FSDP1's state in a file."""
    buffer = io.BytesIO()
    torch.save(state_dict, buffer)
    buffer.seek(0)
    loaded: dict[str, Any] = torch.load(buffer, weights_only=False)
    return loaded
