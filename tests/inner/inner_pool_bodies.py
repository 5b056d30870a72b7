"""Bodies that tests/test_pool.py runs through WorldPool directly, without pytest's collection."""

import os

import torch
import torch.distributed as dist


def test_report_pid(world):
    (world.tmp_path / f"pid{world.rank}").write_text(str(os.getpid()))
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == world.size


def test_ask_for_a_fresh_world(world):
    assert world.respawn_after_test()
    test_report_pid(world)
