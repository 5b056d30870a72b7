"""World specifications: which backend, how many ranks, which device type."""

from __future__ import annotations

from dataclasses import dataclass

BACKEND_DEVICE_TYPES: dict[str, tuple[str, ...]] = {
    "gloo": ("cpu", "cuda"),
    "nccl": ("cuda",),
}
DEFAULT_DEVICE_TYPE: dict[str, str] = {"gloo": "cpu", "nccl": "cuda"}


@dataclass(frozen=True, order=True)
class WorldSpec:
    """A world of ``size`` rank processes joined by one ``backend`` process group.

    Ranks of a ``cuda`` world are bound to ``cuda:<local_rank>``; ``cpu`` worlds
    keep their tensors in host memory.
    """

    backend: str
    size: int
    device_type: str = ""

    def __post_init__(self) -> None:
        if self.backend not in BACKEND_DEVICE_TYPES:
            known = ", ".join(sorted(BACKEND_DEVICE_TYPES))
            raise ValueError(f"unknown backend {self.backend!r}; expected one of: {known}")
        if not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"world size must be a positive integer, got {self.size!r}")
        if not self.device_type:
            object.__setattr__(self, "device_type", DEFAULT_DEVICE_TYPE[self.backend])
        if self.device_type not in BACKEND_DEVICE_TYPES[self.backend]:
            raise ValueError(
                f"backend {self.backend!r} cannot run on device type {self.device_type!r}; "
                f"it supports {', '.join(BACKEND_DEVICE_TYPES[self.backend])}"
            )

    @property
    def label(self) -> str:
        """Short name used in ids and messages, e.g. ``gloo/cpu x4``."""
        return f"{self.backend}/{self.device_type} x{self.size}"

    def unavailable_reason(self) -> str | None:
        """Why this machine cannot host the world, or None when it can.

        Imports torch, so it is only called where a world is really needed.
        """
        import torch
        import torch.distributed as dist

        if not dist.is_available():
            return "torch.distributed is not available in this torch build"
        if self.backend == "nccl" and not dist.is_nccl_available():
            return "this torch build has no NCCL backend"
        if self.backend == "gloo" and not dist.is_gloo_available():
            return "this torch build has no gloo backend"
        if self.device_type == "cuda":
            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if count < self.size:
                return (
                    f"{self.label} needs {self.size} CUDA devices (one per rank); "
                    f"this machine has {count}"
                )
        return None
