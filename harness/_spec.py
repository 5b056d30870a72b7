"""World specifications: which backend, how many ranks, which device type (``WorldSpec``),
and how a session starts its worlds (``WorldSettings``)."""

from __future__ import annotations

from dataclasses import dataclass

from harness import _env, devices


def check_ranks_per_device(backend: str, ranks_per_device: object) -> None:
    """Refuse a count of ranks per device that is not a positive integer, or that makes
    ranks of ``backend`` share a device where it cannot (nccl)."""
    if not isinstance(ranks_per_device, int) or ranks_per_device < 1:
        raise ValueError(f"ranks per device must be a positive integer, got {ranks_per_device!r}")
    if ranks_per_device > 1 and backend == "nccl":
        raise ValueError("nccl runs one rank per device: ranks cannot share one (gloo can)")


@dataclass(frozen=True, order=True)
class WorldSpec:
    """A world of ``size`` rank processes joined by one ``backend`` process group.

    Ranks are bound to ``<device_type>:<local_rank // ranks_per_device>`` (CPU worlds keep
    their tensors in host memory): one rank per device, or several ranks of a backend that
    allows it (gloo) sharing each device, so that one accelerator runs worlds of 2 and 4. The
    names are the build's own, resolved once: by the plugin's options for a session, by
    ``WorldSpec.resolve`` for anyone holding ``auto``.
    """

    backend: str
    size: int
    device_type: str
    ranks_per_device: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"world size must be a positive integer, got {self.size!r}")
        check_ranks_per_device(self.backend, self.ranks_per_device)
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
        """Short name used in ids and messages, e.g. ``gloo/cpu x4``, ``gloo/cuda x4 (2 per
        device)``."""
        label = f"{self.backend}/{self.device_type} x{self.size}"
        if self.ranks_per_device > 1:
            label += f" ({self.ranks_per_device} per device)"
        return label

    @property
    def devices_needed(self) -> int:
        """How many devices of ``device_type`` the world's ranks are bound to."""
        return -(-self.size // self.ranks_per_device)

    def device_index(self, local_rank: int) -> int:
        """The index of the device the rank of ``local_rank`` is bound to."""
        return local_rank // self.ranks_per_device

    def unavailable_reason(self) -> str | None:
        """Why this machine cannot host the world, or None when it can."""
        import torch.distributed as dist

        if not dist.is_available():
            return "torch.distributed is not available in this torch build"
        if not devices.is_available(self.backend):
            return f"this torch build has no {self.backend} backend"
        count = devices.device_count(self.device_type)
        if count is not None and count < self.devices_needed:
            per = (
                "one per rank"
                if self.ranks_per_device == 1
                else f"{self.ranks_per_device} ranks each"
            )
            return (
                f"{self.label} needs {self.devices_needed} {self.device_type} "
                f"device{'s' if self.devices_needed > 1 else ''} ({per}); this machine has {count}"
            )
        return None


@dataclass(frozen=True)
class WorldSettings:
    """How worlds are started; shared by every world of a session."""

    sys_path: list[str]
    rootdir: str
    inifile: str | None
    verbosity: int = 0
    startup_timeout_s: float = 120.0
    pg_timeout_s: float = 1800.0
    # Rank r runs with PYTHONHASHSEED = hash_seed + r: each rank orders sets of strings its own
    # way, as the processes a launcher starts do, and the same way in every run.
    hash_seed: int = _env.DEFAULT_HASH_SEED

    def __post_init__(self) -> None:
        if self.startup_timeout_s <= 0 or self.pg_timeout_s <= 0:
            raise ValueError("world timeouts must be positive")
