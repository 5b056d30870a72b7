"""Run with HARNESS_PRELOAD=gloo_relay_backend --world-backend gloo_relay: worlds on a backend
registered out of tree, their subgroups and meshes included."""

import pytest
import torch
import torch.distributed as dist


@pytest.mark.world(2)
def test_the_world_runs_on_the_registered_backend(world):
    assert world.backend == "gloo_relay"
    assert dist.get_backend() == "gloo_relay"
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 2


@pytest.mark.world(4)
def test_meshes_and_dtensors_use_it_too(world):
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = world.mesh((2, 2), ("dp", "tp"))
    assert dist.get_backend(mesh.get_group("tp")) == "gloo_relay"
    local = distribute_tensor(torch.arange(8.0).reshape(4, 2), mesh, [Shard(0), Replicate()])
    assert torch.equal(local.full_tensor(), torch.arange(8.0).reshape(4, 2))
