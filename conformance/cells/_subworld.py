"""The first ranks of a world, posing as a smaller world: for loads at another world size.

Every rank of the world creates it (its group is made collectively); only
its members may then use it, while the other ranks wait.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from conformance._upstream import device_mesh


@dataclass
class SubWorld:
    """Ranks ``0 .. size - 1`` of ``world``, with the context fields the parallelisms use."""

    world: Any
    size: int
    _group: dist.ProcessGroup | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if not 1 <= self.size <= self.world.size:
            raise ValueError(f"a sub-world of {self.size} ranks in a world of {self.world.size}")
        self._group = dist.new_group(list(range(self.size)))

    @property
    def member(self) -> bool:
        return bool(self.world.rank < self.size)

    @property
    def rank(self) -> int:
        return int(self.world.rank)

    @property
    def device(self) -> torch.device:
        return self.world.device  # type: ignore[no-any-return]

    @property
    def group(self) -> dist.ProcessGroup:
        """The members' group."""
        if not self.member or self._group is None:
            raise RuntimeError(f"rank {self.rank} is not in this {self.size}-rank sub-world")
        return self._group

    def mesh(
        self, shape: tuple[int, ...] | int, names: tuple[str, ...] | None = None
    ) -> device_mesh.DeviceMesh:
        """A 1-D mesh over the members (the parallelisms loaded here need no more)."""
        dims = (shape,) if isinstance(shape, int) else tuple(shape)
        if dims != (self.size,):
            raise ValueError(f"a sub-world mesh is 1-D over {self.size} ranks, not {dims}")
        return device_mesh.DeviceMesh.from_group(
            self.group, self.world.device_type, mesh=list(range(self.size)), mesh_dim_names=names
        )
