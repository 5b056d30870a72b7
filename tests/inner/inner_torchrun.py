"""World tests run under torchrun: every rank runs pytest, rank 0 reports."""

import time

import pytest
import torch
import torch.distributed as dist


def test_plain():
    pass


@pytest.mark.world(2, 4)
def test_allreduce(world):
    assert world.launcher == "torchrun"
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == world.size


@pytest.mark.world(2, 4)
def test_shared_tmp_path(world):
    if world.rank == 0:
        (world.tmp_path / "note").write_text("from rank 0")
    world.barrier()
    assert (world.tmp_path / "note").read_text() == "from rank 0"


@pytest.mark.world(2, 4)
def test_fails_on_last_rank(world):
    print(f"output of rank {world.rank}")
    assert world.rank != world.size - 1


@pytest.mark.world(2, 4)
def test_skips_on_last_rank(world):
    if world.rank == world.size - 1:
        pytest.skip("last rank skips")


@pytest.mark.world(2, 4)
def test_skips_everywhere(world):
    pytest.skip("nothing to do here")


@pytest.mark.world(2, 4)
@pytest.mark.xfail(reason="known divergence", strict=True)
def test_xfail_on_rank_zero(world):
    assert world.rank != 0


@pytest.mark.world(2, timeout=3)
def test_hangs_on_rank_one(world):
    if world.rank == 1:
        time.sleep(600)
