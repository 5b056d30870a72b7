"""Process groups and device meshes from one test to the next, on a rank.

DTensor caches its sharding decisions by mesh equality, so they must go with the groups they
name: a later test's equal mesh would hit them and get specs on destroyed groups. Clearing them
after every test made every test decide each DTensor operation anew (the decisions of two Adam
steps cost a 4-rank FSDP2 cell about 60 ms, more than the steps). So the meshes tests ask of
``world.mesh`` are kept for the world's next test, with the caches, while tests make no other
process group and destroy none of the meshes'; a test that did not pass keeps them only where
this rank can count the collectives it ran on them (the controller then keeps the world only
where every rank ran as many on each: nothing is left in flight). Otherwise every group but
the default one is destroyed and the caches are cleared: the next test starts as in a fresh
world. Ranks decide alike: from their process-group counter (``new_group`` counts on every
rank, member or not) and their own outcome, on both of which the controller keeps a world only
where ranks agree.

What tests make on the meshes and ask to keep (``world.kept``: a cell trained and its state
read, set-up every case of a test shares) lives exactly as long as they do: it may hold
DTensors and ShardedTensors on their groups.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh

MeshKey = tuple[str, tuple[int, ...], tuple[str, ...] | None]
T = TypeVar("T")


class KeptMeshes:
    """The meshes of a rank's world tests, by device type, shape and dim names."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self._meshes: dict[MeshKey, DeviceMesh] = {}
        # The kept meshes' groups, each once, in the order they were made: resolved when a
        # mesh is made, as a mesh resolves a destroyed group differently on each release
        # (RuntimeError on 2.13, TypeError on 2.6).
        self._groups: dict[ProcessGroup, None] = {}
        # What tests made and asked to keep (``kept``), by their key.
        self._kept: dict[Hashable, Any] = {}
        # The process-group counter as it would read had only the kept meshes made groups.
        self._expected_count = dist.get_pg_count()

    def mesh(
        self, device_type: str, dims: tuple[int, ...], names: tuple[str, ...] | None
    ) -> DeviceMesh:
        """The kept mesh of this shape and names, made (on every rank) where there is none."""
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        key = (device_type, dims, names)
        if key not in self._meshes:
            before = dist.get_pg_count()
            mesh = self._meshes[key] = init_device_mesh(device_type, dims, mesh_dim_names=names)
            self._expected_count += dist.get_pg_count() - before
            self._groups.update(dict.fromkeys(mesh.get_group(dim) for dim in range(mesh.ndim)))
        return self._meshes[key]

    def kept(self, key: Hashable, make: Callable[[], T], agree: Callable[[], None]) -> T:
        """``make()``'s result for ``key``, made where it is not kept yet and kept with the
        meshes. Every rank must ask for it alike, as for a mesh. The ranks that made it meet
        at ``agree`` (a barrier) before keeping it, so that it is kept on every rank or none:
        where ``make`` raised on some, the others wait there until the harness cuts them as
        hung, and the world is replaced."""
        if key not in self._kept:
            value = make()
            agree()
            self._kept[key] = value
            return value
        kept: T = self._kept[key]  # what ``make`` for this key returned
        return kept

    def after_test(self, passed: bool, counted: bool) -> int:
        """Keep the meshes if the test made no other group and passed, or its collectives on
        them were ``counted``; else undo every group and cached decision. Returns the
        process-group counter."""
        import torch.distributed as dist

        count = dist.get_pg_count()
        intact = self.groups() is not None
        if not ((passed or counted) and count == self._expected_count and intact):
            _destroy_groups()
            self._meshes.clear()
            self._groups.clear()
            self._kept.clear()
            self._expected_count = count
        return count

    def groups(self) -> list[ProcessGroup] | None:
        """The groups of the kept meshes, each once, in the order they were made (none while
        no mesh is kept); None where a test destroyed one."""
        from torch.distributed import distributed_c10d as c10d

        if not all(group in c10d._world.pg_map for group in self._groups):
            return None
        return list(self._groups)


def _destroy_groups() -> None:
    """Destroy every group but the default one, and DTensor's decisions that name them."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    for group in list(c10d._world.pg_map):
        if group is not c10d.GroupMember.WORLD:
            dist.destroy_process_group(group)
    _clear_dtensor_caches()


def _clear_dtensor_caches() -> None:
    """Forget DTensor's cached sharding decisions: they hold the meshes of earlier tests.

    A mesh equal to an earlier test's (same ranks, shape and names) hits those
    caches and gets back specs on the old mesh, whose groups were destroyed.
    Until a test has imported DTensor there is nothing to clear, and importing
    it here would cost every world seconds at its first test.
    """
    if "torch.distributed.tensor" not in sys.modules:
        return
    for clear in _dtensor_cache_clears():
        clear()


@functools.cache
def _dtensor_cache_clears() -> tuple[Callable[[], None], ...]:
    """The ``cache_clear`` of each of DTensor's sharding caches, found once per process."""
    import torch

    try:
        from torch.distributed.tensor import DTensor, _redistribute
    except ImportError:  # a torch whose DTensor lives elsewhere
        return ()
    propagator = getattr(getattr(DTensor, "_op_dispatcher", None), "sharding_propagator", None)
    cached = [getattr(_redistribute, "_gen_transform_infos", None)]
    if propagator is not None:
        cached += [getattr(propagator, name, None) for name in dir(propagator)]
        # Releases such as 2.8 wrap the propagation cache in a thread-local holder of an
        # lru_cache (its ``cache``); ranks run tests on their main thread.
        cached += [getattr(function, "cache", None) for function in cached]
    clears = [getattr(function, "cache_clear", None) for function in cached]
    # The C++ dispatch fast path keeps its own cache.
    clears.append(getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None))
    return tuple(clear for clear in clears if callable(clear))
