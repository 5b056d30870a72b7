"""Faults injected into world tests; each fault is followed by a probe that must pass.

Every body records its rank's pid, so the outer tests can tell a reused
world from a fresh one.
"""

import ctypes
import os
import signal
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from harness._world import CRASH_GRACE_S


def record_pid(world, name):
    pids = Path(os.environ["INNER_WORKDIR"]) / "pids"
    pids.mkdir(exist_ok=True)
    (pids / f"{name}-w{world.size}-r{world.rank}").write_text(str(os.getpid()))


def last_rank(world):
    return world.rank == world.size - 1


@pytest.mark.world(1, 2, 4)
def test_probe_start(world):
    record_pid(world, "probe_start")
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == world.size


@pytest.mark.world(1, 2, 4)
def test_probe_reused(world):
    record_pid(world, "probe_reused")


@pytest.mark.world(1, 2, 4, timeout=3)
def test_hang_one_rank(world):
    record_pid(world, "hang_one_rank")
    if last_rank(world):
        time.sleep(600)


@pytest.mark.world(1, 2, 4)
def test_probe_after_hang_one_rank(world):
    record_pid(world, "probe_after_hang_one_rank")
    dist.barrier()


@pytest.mark.world(1, 2, 4, timeout=3)
def test_hang_all_ranks(world):
    record_pid(world, "hang_all_ranks")
    time.sleep(600)


@pytest.mark.world(1, 2, 4)
def test_probe_after_hang_all_ranks(world):
    record_pid(world, "probe_after_hang_all_ranks")
    dist.barrier()


@pytest.mark.world(1, 2, 4)
def test_exception_one_rank(world):
    record_pid(world, "exception_one_rank")
    if last_rank(world):
        raise ValueError(f"injected failure on rank {world.rank}")


@pytest.mark.world(1, 2, 4)
def test_probe_after_exception_one_rank(world):
    record_pid(world, "probe_after_exception_one_rank")
    dist.barrier()


@pytest.mark.world(1, 2, 4)
def test_failure_on_every_rank_in_step(world):
    record_pid(world, "failure_on_every_rank_in_step")
    dist.all_reduce(torch.ones(1))
    raise ValueError(f"injected failure on rank {world.rank}")


@pytest.mark.world(1, 2, 4)
def test_probe_after_failure_on_every_rank_in_step(world):
    record_pid(world, "probe_after_failure_on_every_rank_in_step")
    t = torch.full((1,), float(world.rank))
    dist.all_reduce(t)
    assert t.item() == sum(range(world.size))


@pytest.mark.world(2, 4)
def test_failure_out_of_step(world):
    record_pid(world, "failure_out_of_step")
    if world.rank == 0:
        dist.isend(torch.ones(1), dst=1)  # never received: it would reach the next test
    raise ValueError(f"injected failure on rank {world.rank}")


@pytest.mark.world(2, 4)
def test_probe_after_failure_out_of_step(world):
    record_pid(world, "probe_after_failure_out_of_step")
    t = torch.zeros(1)
    if world.rank == 0:
        dist.send(torch.full((1,), 7.0), dst=1)
    elif world.rank == 1:
        dist.recv(t, src=0)
        assert t.item() == 7.0
    dist.barrier()


@pytest.mark.world(1, 2, 4)
def test_exit_one_rank(world):
    record_pid(world, "exit_one_rank")
    if last_rank(world):
        print(f"rank {world.rank} of {world.size} exits now", flush=True)
        os._exit(13)
    dist.barrier()


@pytest.mark.world(1, 2, 4)
def test_probe_after_exit_one_rank(world):
    record_pid(world, "probe_after_exit_one_rank")
    dist.barrier()


@pytest.mark.world(1, 2, 4)
def test_segfault_one_rank(world):
    record_pid(world, "segfault_one_rank")
    if last_rank(world):
        ctypes.string_at(0)
    dist.barrier()


@pytest.mark.world(1, 2, 4)
def test_probe_after_segfault_one_rank(world):
    record_pid(world, "probe_after_segfault_one_rank")
    dist.barrier()


@pytest.mark.world(1, 2, 4)
def test_sigkill_one_rank(world):
    record_pid(world, "sigkill_one_rank")
    if last_rank(world):
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()


@pytest.mark.world(1, 2, 4)
def test_probe_after_sigkill_one_rank(world):
    record_pid(world, "probe_after_sigkill_one_rank")
    dist.barrier()


@pytest.mark.world(2, 4)
def test_killed_as_arranged(world):
    record_pid(world, "killed_as_arranged")
    assert world.may_be_killed(world.size - 1)
    if last_rank(world):
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(CRASH_GRACE_S + 1)  # longer than the grace a crash would leave the others


@pytest.mark.world(2, 4)
def test_probe_after_killed_as_arranged(world):
    record_pid(world, "probe_after_killed_as_arranged")
    dist.barrier()


@pytest.mark.world(2, 4)
def test_killed_as_arranged_then_a_survivor_fails(world):
    record_pid(world, "killed_as_arranged_then_a_survivor_fails")
    assert world.may_be_killed(world.size - 1)
    if last_rank(world):
        os.kill(os.getpid(), signal.SIGKILL)
    if world.rank == 0:
        raise ValueError("injected failure on rank 0")


@pytest.mark.world(2, 4)
def test_probe_after_killed_as_arranged_then_a_survivor_fails(world):
    record_pid(world, "probe_after_killed_as_arranged_then_a_survivor_fails")
    dist.barrier()


@pytest.mark.world(2, 4)
def test_may_be_killed_but_exits(world):
    record_pid(world, "may_be_killed_but_exits")
    assert world.may_be_killed(world.size - 1)
    if last_rank(world):
        os._exit(13)


@pytest.mark.world(2, 4)
def test_probe_after_may_be_killed_but_exits(world):
    record_pid(world, "probe_after_may_be_killed_but_exits")
    dist.barrier()


@pytest.mark.world(2, 4, timeout=3)
def test_collective_on_some_ranks(world):
    record_pid(world, "collective_on_some_ranks")
    if world.rank == 0:
        dist.all_reduce(torch.ones(1))


@pytest.mark.world(2, 4)
def test_probe_after_collective_on_some_ranks(world):
    record_pid(world, "probe_after_collective_on_some_ranks")
    dist.barrier()


@pytest.mark.world(2, 4, timeout=120)
def test_failure_leaves_peers_waiting(world):
    record_pid(world, "failure_leaves_peers_waiting")
    if last_rank(world):
        raise ValueError(f"injected failure on rank {world.rank}")
    dist.barrier()  # never left: the last rank raised instead of joining it


@pytest.mark.world(2, 4)
def test_probe_after_failure_leaves_peers_waiting(world):
    record_pid(world, "probe_after_failure_leaves_peers_waiting")
    dist.barrier()


def clean_up_that_hangs():
    time.sleep(600)


def clean_up_that_exits():
    os._exit(17)


def fault_the_last_ranks_clean_up(world, fault):
    """Make a group for clean-up to destroy, and make the last rank's destroying fault:
    its world is replaced after this test, so the fault goes with it."""
    dist.new_group()
    if last_rank(world):
        import harness._groups

        harness._groups._destroy_groups = fault


@pytest.mark.world(1, 2, 4, timeout=3)
def test_hang_in_clean_up(world):
    record_pid(world, "hang_in_clean_up")
    fault_the_last_ranks_clean_up(world, clean_up_that_hangs)


@pytest.mark.world(1, 2, 4)
def test_probe_after_hang_in_clean_up(world):
    record_pid(world, "probe_after_hang_in_clean_up")
    dist.barrier()


@pytest.mark.world(1, 2, 4)
def test_exit_in_clean_up(world):
    record_pid(world, "exit_in_clean_up")
    fault_the_last_ranks_clean_up(world, clean_up_that_exits)


@pytest.mark.world(1, 2, 4)
def test_probe_after_exit_in_clean_up(world):
    record_pid(world, "probe_after_exit_in_clean_up")
    dist.barrier()


@pytest.mark.world(1, 2, 4)
def test_skip_on_some_ranks(world):
    record_pid(world, "skip_on_some_ranks")
    if last_rank(world):
        pytest.skip(f"rank {world.rank} has nothing to do")


@pytest.mark.world(1, 2, 4)
def test_probe_after_skip_on_some_ranks(world):
    record_pid(world, "probe_after_skip_on_some_ranks")
    dist.barrier()
