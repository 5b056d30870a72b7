"""The devices a process group moves tensors on, named by type: no accelerator is assumed.

A group's backend serves some device types (``cpu:gloo,cuda:gloo`` serves both, ``nccl`` serves
``cuda``, a vendor's backend its own). Where the contract puts a tensor "on the group's
device", the CPU wins when the group serves it, else the group's accelerator at this process's
current index: the rule ``init_process_group`` documents for a group of several backends.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

CPU = torch.device("cpu")


def served_device_types(group: dist.ProcessGroup | None = None) -> tuple[str, ...]:
    """The device types ``group``'s backends serve, as ``init_process_group`` registered them."""
    config = dist.get_backend_config(group)
    if ":" in config:
        return tuple(part.split(":")[0] for part in config.split(","))
    capability: dict[str, list[str]] = getattr(dist.Backend, "backend_capability", {})
    return tuple(capability.get(config, ("cpu",)))


def current_device(device_type: str) -> torch.device:
    """``device_type`` at this process's current index (the CPU has none)."""
    if device_type == CPU.type:
        return CPU
    if _accelerator() == device_type:
        api = torch.accelerator
        index = getattr(api, "current_device_index", None) or api.current_device_idx
        return torch.device(device_type, index())
    return torch.device(device_type, torch.get_device_module(device_type).current_device())


def default_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """Where tensors for ``group`` go when nothing says otherwise: the CPU if it serves it."""
    if not dist.is_initialized():
        return CPU
    served = served_device_types(group)
    if not served or CPU.type in served:
        return CPU
    return current_device(served[0])


def group_device(group: dist.ProcessGroup | None, preferred: torch.device) -> torch.device:
    """``preferred`` if ``group`` can move tensors there, else its default device."""
    if preferred.type in served_device_types(group):
        return preferred
    return default_device(group)


def device_count(device_type: str) -> int:
    """How many ``device_type`` devices this node has (1 for the CPU)."""
    return int(torch.get_device_module(device_type).device_count())


def pinning_accelerator() -> str:
    """The accelerator that page-locked host memory is pinned for; RuntimeError without one."""
    found = _accelerator()
    if found is None:
        raise RuntimeError(
            "pin_memory needs an accelerator to pin host memory for; this build has none"
        )
    return found


def _accelerator() -> str | None:
    """The build's accelerator type (``torch.accelerator``, 2.6+), or None."""
    api = getattr(torch, "accelerator", None)
    found = api.current_accelerator() if api is not None and api.is_available() else None
    return None if found is None else str(found.type)
