"""The world plugin's features, as a test author uses them."""

import gc
import os
import time

import pytest
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from harness import memory


@pytest.mark.world(1, 2, 4)
def test_context_fields(world):
    assert world.size == dist.get_world_size()
    assert world.rank == dist.get_rank()
    assert world.local_rank == world.rank
    assert world.backend == "gloo"
    assert world.device == torch.device("cpu")
    assert world.launcher in ("spawn", "torchrun")


@pytest.mark.world(2)
@pytest.mark.parametrize("value", [3, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_parametrized(world, value, dtype):
    t = torch.full((2,), value, dtype=dtype)
    dist.all_reduce(t)
    assert t.dtype == dtype
    assert t.tolist() == [value * world.size] * 2


@pytest.mark.world(1, 2, 4, applies=lambda size, parts: size % parts == 0)
@pytest.mark.parametrize("parts", [2, 4])
def test_only_where_the_parts_divide_the_world(world, parts):
    assert world.size % parts == 0


@pytest.mark.world(2)
def test_assertion_shows_values(world):
    print(f"printed by rank {world.rank}")
    assert {"rank": world.rank, "ok": True} == {"rank": 0, "ok": True}


@pytest.mark.world(2, 4)
def test_shared_tmp_path(world):
    if world.rank == 0:
        (world.tmp_path / "from_rank0.txt").write_text("hello")
    world.barrier()
    assert (world.tmp_path / "from_rank0.txt").read_text() == "hello"


@pytest.mark.world(4)
def test_mesh_2d(world):
    mesh = world.mesh((2, 2), ("dp", "tp"))
    t = torch.ones(1)
    dist.all_reduce(t, group=mesh.get_group("tp"))
    assert t.item() == 2
    assert mesh.mesh_dim_names == ("dp", "tp")


@pytest.mark.world(2, 4)
def test_creates_subgroups(world):
    dist.new_group(list(range(world.size)))
    world.mesh(world.size, ("dp",))
    assert len(c10d._world.pg_map) > 1


@pytest.mark.world(2, 4)
def test_subgroups_of_earlier_tests_are_gone(world):
    assert list(c10d._world.pg_map) == [c10d.GroupMember.WORLD]


@pytest.mark.world(4)
@pytest.mark.parametrize("round", [1, 2])
def test_dtensor_ops_on_a_mesh_equal_to_an_earlier_tests(world, round):
    """DTensor caches sharding by mesh equality; round 1 makes a group of its own, so its
    mesh is destroyed after it, and round 2 must not get specs on it from the caches."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = world.mesh((2, 2), ("dp", "tp"))
    local = distribute_tensor(torch.arange(12.0).reshape(6, 2), mesh, [Shard(0), Shard(1)])
    assert torch.equal(
        (local * 2).redistribute(mesh, [Replicate(), Replicate()]).to_local(),
        torch.arange(12.0).reshape(6, 2) * 2,
    )
    if round == 1:
        dist.new_group(list(range(world.size)))


_SEEN: dict[str, object] = {}  # what earlier steps saw in this rank process


def _made_on_rank_0_alone(rank: int) -> object:
    if rank != 0:
        raise RuntimeError(f"rank {rank} cannot make it")
    return object()


@pytest.mark.world(2)
@pytest.mark.parametrize(
    "step",
    [
        "made",
        "kept",
        "makes_a_group",
        "fresh_after_a_group",
        "destroys_its_group",
        "fresh_after_destroying",
        "fails",
        "kept_after_failing",
        "fails_out_of_step",
        "fresh_world_after_failing_out_of_step",
        "kept_object_fails_to_be_made_on_rank_1",
        "fresh_world_after_a_failed_make",
    ],
)
def test_world_meshes_are_kept_while_tests_pass(world, step):
    """One world runs the steps in order: a mesh, and what tests keep with it
    (``world.kept``), outlives a passing test, and a failing one whose ranks all ran as many
    collectives on it; not one that made another group or destroyed one of the mesh's (then
    its groups are destroyed), nor a failure after which one rank ran more collectives on it
    than another (then the world goes: data could be in flight). What one rank failed to
    make is kept by none: the other waits for it, is cut, and the world goes."""
    mesh = world.mesh((1, world.size), ("single", "all"))
    groups = {mesh.get_group(dim) for dim in range(mesh.ndim)} - {c10d.GroupMember.WORLD}
    assert groups, "a mesh of two dims has a group besides the default one"
    if step == "kept_object_fails_to_be_made_on_rank_1":
        world.kept("made on rank 0 alone", lambda: _made_on_rank_0_alone(world.rank))
    made = world.kept("made with the mesh", object)
    if step in ("made", "fresh_world_after_failing_out_of_step", "fresh_world_after_a_failed_make"):
        assert os.getpid() != _SEEN.get("pid"), "the world was kept"
        _SEEN.update(pid=os.getpid(), mesh=mesh, groups=groups, made=made)
        return
    assert os.getpid() == _SEEN["pid"], "the steps ran in another world"
    earlier = _SEEN["mesh"]
    if step.startswith("fresh"):
        assert mesh is not earlier
        assert made is not _SEEN["made"]
        assert not _SEEN["groups"] & set(c10d._world.pg_map)
        assert set(c10d._world.pg_map) == groups | {c10d.GroupMember.WORLD}
        _SEEN.update(mesh=mesh, groups=groups, made=made)
        return
    assert mesh is earlier
    assert made is _SEEN["made"]
    if step == "makes_a_group":
        dist.new_group(list(range(world.size)))
    if step == "destroys_its_group":
        dist.destroy_process_group(mesh.get_group("single"))
    # Of two ranks, the mesh's "all" dim is the default group; each "single" group is one
    # rank's own: a collective there counts on the mesh alone.
    if step == "fails":
        dist.all_reduce(torch.ones(1), group=mesh.get_group("single"))
        raise AssertionError("every rank fails this step, in step")
    if step == "fails_out_of_step":
        if world.rank == 0:
            dist.all_reduce(torch.ones(1), group=mesh.get_group("single"))
        raise AssertionError("every rank fails this step, rank 0 one collective ahead")


@pytest.mark.world(2)
@pytest.mark.xfail(reason="a known divergence", strict=True)
def test_xfail_on_one_rank(world):
    assert world.rank == 0


@pytest.mark.world(2)
@pytest.mark.xfail(reason="expected to fail but passes", strict=True)
def test_strict_xfail_that_passes(world):
    pass


@pytest.mark.world(2)
def test_imperative_xfail(world):
    pytest.xfail("every rank says so")


@pytest.mark.world(2)
def test_asks_for_a_controller_fixture(world, tmp_path):
    pass


def test_plain():
    assert torch.ones(1).item() == 1


@pytest.mark.timeout(1)
def test_plain_guarded_by_pytest_timeout():
    time.sleep(30)


@pytest.mark.world(2)
def test_ranks_run_with_hash_seeds_of_their_own(world):
    # The default --world-hash-seed 1: rank r runs with PYTHONHASHSEED 1 + r, so the ranks order a
    # set of names each its own way, as a launcher's processes would.
    seeds = [None] * world.size
    dist.all_gather_object(seeds, os.environ.get("PYTHONHASHSEED"))
    assert seeds == ["1", "2"]
    orders = [None] * world.size
    dist.all_gather_object(orders, list({"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}))
    assert orders[0] != orders[1]


@pytest.mark.world(2)
def test_what_a_rank_imported_is_out_of_the_collectors_sight(world):
    # Frozen at the import of this module: a full collection (a peak-memory probe makes one
    # per operation) scans only what tests made since, not torch's objects.
    import torch  # noqa: F401 - among what was imported before the freeze

    assert gc.get_freeze_count() > 100_000
    assert len(gc.get_objects()) < gc.get_freeze_count()


@pytest.mark.world(2)
def test_ranks_start_with_large_tensors_kept_out_of_the_heap(world):
    # glibc reads the variable as the process starts; tests/test_memory_probe.py shows why.
    assert memory.ALLOCATOR_ENV.items() <= os.environ.items()
