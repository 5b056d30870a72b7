"""World tests under two torchrun agents; the second agent's ranks misbehave on request."""

import os
import time

import pytest
import torch
import torch.distributed as dist

SECOND_AGENT = os.environ.get("GROUP_RANK") == "1"
MISBEHAVE = os.environ.get("INNER_MISBEHAVE", "")


@pytest.mark.world(4)
def test_ranks_span_two_agents(world):
    agents = [None] * world.size
    dist.all_gather_object(agents, os.environ["GROUP_RANK"])
    assert agents == ["0", "0", "1", "1"]
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == world.size


@pytest.mark.world(4, timeout=5)
def test_misbehaves_on_the_second_agent(world):
    world.barrier()
    if SECOND_AGENT and MISBEHAVE == "crash":
        os._exit(7)
    if SECOND_AGENT and MISBEHAVE == "hang":
        time.sleep(600)


@pytest.mark.world(4)
def test_after_the_misbehaviour(world):
    pass
