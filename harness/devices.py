"""Device types and process-group backends, as the torch build under test knows them.

The harness names no accelerator. A world's device type and backend are strings the build
resolves: ``cuda``/``nccl`` is one pair; ``xpu``/``xccl``, a vendor's ``npu``/``hccl`` and any
backend registered out of tree with ``torch.distributed.Backend.register_backend`` are others.
``auto`` picks the build's accelerator (``torch.accelerator``) and its default backend
(``dist.get_default_backend_for_device``), and ``cpu``/``gloo`` where there is none or the
build predates those APIs. Every function imports torch: call them where a world is needed.
"""

from __future__ import annotations

from typing import Final

AUTO: Final = "auto"
CPU: Final = "cpu"
# Builds without dist.get_default_backend_for_device (before 2.6) pair devices this way.
_FALLBACK_BACKENDS: Final = {"cpu": "gloo", "cuda": "nccl", "xpu": "xccl"}


def accelerator() -> str | None:
    """The device type of the build's accelerator, or None (none present, or no
    ``torch.accelerator`` in this build)."""
    import torch

    api = getattr(torch, "accelerator", None)
    if api is None or not api.is_available():
        return None
    current = api.current_accelerator()
    return None if current is None else str(current.type)


def default_backend(device_type: str) -> str:
    """The backend the build uses for ``device_type`` by default."""
    import torch.distributed as dist

    lookup = getattr(dist, "get_default_backend_for_device", None)
    if lookup is not None:
        try:
            return str(lookup(device_type))
        except (RuntimeError, ValueError):
            pass  # a device type without a default: fall back as older builds do
    return _FALLBACK_BACKENDS.get(device_type, "gloo")


def registered_backends() -> tuple[str, ...]:
    """The backends this build knows by name: built in (whether compiled in or not, as NCCL
    in a CPU build) or registered out of tree."""
    import torch.distributed as dist

    return tuple(name for name in dist.Backend.backend_list if name != "undefined")


def is_available(backend: str) -> bool:
    """Whether this build can create process groups of ``backend``."""
    import torch.distributed as dist

    check = getattr(dist, "is_backend_available", None)
    if check is not None:
        return bool(check(backend))
    return bool(getattr(dist, f"is_{backend}_available", lambda: True)())


def available_backends() -> tuple[str, ...]:
    """The registered backends this build can create process groups of."""
    return tuple(name for name in registered_backends() if is_available(name))


def device_types_of(backend: str) -> tuple[str, ...]:
    """The device types ``backend`` declared when it was registered (empty: it declared none)."""
    import torch.distributed as dist

    capability = getattr(dist.Backend, "backend_capability", {})
    return tuple(capability.get(backend, ()))


def is_device_type(name: str) -> bool:
    """Whether this build knows the device type ``name`` (``cpu``, ``cuda``, a renamed
    PrivateUse1 device such as ``npu``, ...)."""
    import torch

    try:
        torch.device(name)
    except RuntimeError:
        return False
    return True


def resolve(backend: str, device_type: str) -> tuple[str, str]:
    """The backend and device type a world uses, ``auto`` resolved; ValueError, naming what
    the build has, for a name it does not know or a pair that cannot work."""
    backend = backend.lower()
    if device_type == AUTO:
        device_type = _device_for(backend)
    if not is_device_type(device_type):
        found = accelerator()
        raise ValueError(
            f"unknown device type {device_type!r}; this build has {CPU}"
            + (f" and {found}" if found else "")
        )
    if backend == AUTO:
        backend = default_backend(device_type)
    if backend not in registered_backends():
        raise ValueError(
            f"unknown backend {backend!r}; this torch build has: {', '.join(available_backends())}"
        )
    declared = device_types_of(backend)
    if declared and device_type not in declared:
        raise ValueError(
            f"backend {backend!r} cannot run on device type {device_type!r}; "
            f"it supports {', '.join(declared)}"
        )
    return backend, device_type


def _device_for(backend: str) -> str:
    """``auto``'s device type: the accelerator, unless an explicit backend does not serve it
    (then CPU where the backend serves CPU, else the backend's first device type)."""
    found = accelerator()
    if backend == AUTO:
        return found or CPU
    declared = device_types_of(backend)
    if found and default_backend(found) == backend:
        return found
    if not declared or CPU in declared:
        return CPU
    return declared[0]


def device_count(device_type: str) -> int | None:
    """How many devices of ``device_type`` this machine has; None for the CPU (no limit)."""
    import torch

    if device_type == CPU:
        return None
    api = getattr(torch, "accelerator", None)
    if api is not None and accelerator() == device_type:
        return int(api.device_count())
    module = getattr(torch, device_type, None)
    count = getattr(module, "device_count", None)
    return int(count()) if callable(count) else 0


def device_names(device_type: str) -> list[str]:
    """The names of this machine's ``device_type`` devices, as its device module tells them
    (``TYPE:INDEX`` where the module has no names); empty for the CPU."""
    import torch

    name = getattr(torch.get_device_module(device_type), "get_device_name", None)
    count = device_count(device_type) or 0
    return [str(name(i)) if callable(name) else f"{device_type}:{i}" for i in range(count)]


def bind(device_type: str, local_rank: int) -> None:
    """Make ``device_type:local_rank`` this process's current device (nothing for the CPU)."""
    import torch

    if device_type == CPU:
        return
    api = getattr(torch, "accelerator", None)
    if api is not None and accelerator() == device_type and hasattr(api, "set_device_index"):
        api.set_device_index(local_rank)
    else:
        torch.get_device_module(device_type).set_device(local_rank)


def synchronize(device_type: str) -> None:
    """Wait for the work queued on this process's current ``device_type`` device (nothing for
    the CPU, whose work is done when its call returns)."""
    import torch

    if device_type == CPU:
        return
    api = getattr(torch, "accelerator", None)
    if api is not None and accelerator() == device_type:
        api.synchronize()
    else:
        torch.get_device_module(device_type).synchronize()
