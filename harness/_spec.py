"""World specifications: which backend, how many ranks, which device type."""

from __future__ import annotations

from dataclasses import dataclass

from harness import devices


@dataclass(frozen=True, order=True)
class WorldSpec:
    """A world of ``size`` rank processes joined by one ``backend`` process group.

    Ranks are bound to ``<device_type>:<local_rank>`` (CPU worlds keep their tensors in host
    memory). The names are the build's own, resolved once: by the plugin's options for a
    session, by ``WorldSpec.resolve`` for anyone holding ``auto``.
    """

    backend: str
    size: int
    device_type: str

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"world size must be a positive integer, got {self.size!r}")
        if devices.AUTO in (self.backend, self.device_type):
            raise ValueError(
                f"a WorldSpec takes resolved names, got {self.backend}/{self.device_type}: "
                "WorldSpec.resolve resolves auto"
            )

    @classmethod
    def resolve(cls, backend: str, size: int, device_type: str = devices.AUTO) -> WorldSpec:
        """The spec of these names, ``auto`` resolved against the torch build (which imports
        torch); a name the build lacks is a ValueError that lists what it has."""
        backend, device_type = devices.resolve(backend, device_type)
        return cls(backend, size, device_type)

    @property
    def label(self) -> str:
        """Short name used in ids and messages, e.g. ``gloo/cpu x4``."""
        return f"{self.backend}/{self.device_type} x{self.size}"

    def unavailable_reason(self) -> str | None:
        """Why this machine cannot host the world, or None when it can."""
        import torch.distributed as dist

        if not dist.is_available():
            return "torch.distributed is not available in this torch build"
        if not devices.is_available(self.backend):
            return f"this torch build has no {self.backend} backend"
        count = devices.device_count(self.device_type)
        if count is not None and count < self.size:
            return (
                f"{self.label} needs {self.size} {self.device_type} devices (one per rank); "
                f"this machine has {count}"
            )
        return None
