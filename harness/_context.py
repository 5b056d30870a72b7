"""The ``world`` object a test body receives on every rank."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from harness._groups import KeptMeshes
from harness._spec import WorldSpec
from harness.devices import CPU

if TYPE_CHECKING:
    import torch
    from torch.distributed.device_mesh import DeviceMesh

T = TypeVar("T")


@dataclass
class AfterTest:
    """What a test asks of the harness for the time after it, on this rank."""

    respawn: bool = False  # the next test gets a fresh world


@dataclass(frozen=True)
class WorldContext:
    """This rank's view of its world during one test.

    ``tmp_path`` is the same directory on every rank of the test (on one
    node); ``device`` is the device the rank is bound to (``<device_type>:<local_rank>`` with
    one rank per device) in accelerator worlds, else ``cpu``.
    """

    spec: WorldSpec
    rank: int
    local_rank: int
    shared_dir: Path  # created on first use of ``tmp_path``
    launcher: str  # "spawn" or "torchrun"
    after_test: AfterTest = field(default_factory=AfterTest)
    # The rank's meshes kept between tests (``_groups``); None: a new mesh at each call.
    meshes: KeptMeshes | None = None
    # Tells the controller something during the body (spawn mode); None under torchrun.
    tell_controller: Callable[[object], None] | None = None

    @property
    def tmp_path(self) -> Path:
        """A directory for this test, the same on every rank; created on first use."""
        self.shared_dir.mkdir(parents=True, exist_ok=True)
        return self.shared_dir

    def __repr__(self) -> str:
        return f"<world rank {self.rank} of {self.spec.label}>"

    @property
    def size(self) -> int:
        return self.spec.size

    @property
    def backend(self) -> str:
        return self.spec.backend

    @property
    def device_type(self) -> str:
        return self.spec.device_type

    @property
    def device(self) -> torch.device:
        import torch

        if self.device_type == CPU:
            return torch.device(CPU)
        return torch.device(self.device_type, self.spec.device_index(self.local_rank))

    def mesh(
        self, shape: tuple[int, ...] | int, names: tuple[str, ...] | None = None
    ) -> DeviceMesh:
        """A ``DeviceMesh`` over all ranks with this ``shape`` and optional dim ``names``.

        The shape's product must equal the world size. Every rank must ask for it, as for
        any mesh. In spawned and forked worlds, the mesh of a shape and names is made once
        and kept for the world's next tests while they make no other process group and
        every rank runs as many collectives on it (``harness/_groups.py``).
        """
        from torch.distributed.device_mesh import init_device_mesh

        dims = (shape,) if isinstance(shape, int) else tuple(shape)
        product = 1
        for d in dims:
            product *= d
        if product != self.size:
            raise ValueError(f"mesh shape {dims} has {product} ranks; this world has {self.size}")
        if names is not None and len(names) != len(dims):
            raise ValueError(f"mesh shape {dims} has {len(dims)} dims but {len(names)} names")
        if self.meshes is not None:
            return self.meshes.mesh(self.device_type, dims, names)
        return init_device_mesh(self.device_type, dims, mesh_dim_names=names)

    def kept(self, key: Hashable, make: Callable[[], T]) -> T:
        """``make()``'s result for ``key``, made once and kept for the world's later tests as
        long as its meshes are (``mesh``): set-up that many cases share, such as a cell
        trained and its state dict read, made by the first that asks.

        Every rank must ask for it alike, as for a mesh; ``make`` may run collectives and
        make DTensors on the kept meshes. Callers share what it returns: they copy what they
        change. It is kept on every rank or none: where ``make`` raises on some ranks, the
        others wait for them until they are cut as hung, and the world is replaced. Under
        torchrun, where meshes are not kept, it is made at each call.
        """
        if self.meshes is None:
            return make()
        return self.meshes.kept(key, make, agree=self.barrier)

    def respawn_after_test(self) -> bool:
        """Ask for a fresh world for the next test, because this one leaves its rank
        processes unfit to run another (it killed a process they started, say); return
        whether it will be given. Under torchrun, whose ranks cannot be respawned, it will
        not: a test that must leave a fresh world behind skips there."""
        if self.launcher == "torchrun":
            return False
        self.after_test.respawn = True
        return True

    def may_be_killed(self, rank: int) -> bool:
        """Say, on every rank, that ``rank`` may be killed with SIGKILL during this test, by
        the test's own doing (a save cut short, as by a preemption), before anything that may
        kill it runs. Its death by SIGKILL is then its part of the test, not a crash; the other
        ranks' results are the verdict, under the test's deadline, and the next test gets a
        fresh world. Return whether that holds, alike on every rank: under torchrun, where a
        rank's death ends the launched world, it does not, and such a test skips there."""
        if self.launcher == "torchrun" or self.tell_controller is None:
            return False
        from harness import _messages as msg

        if rank == self.rank:
            self.tell_controller(msg.MayBeKilled(rank=self.rank))
        self.after_test.respawn = True
        return True

    def barrier(self) -> None:
        """Wait until every rank of the world reaches this point."""
        import torch.distributed as dist

        if self.device_type != CPU:
            dist.barrier(device_ids=[self.spec.device_index(self.local_rank)])
        else:
            dist.barrier()
