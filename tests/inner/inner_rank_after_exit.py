"""A test module that ranks import; its test runs after one whose module ends ranks."""

import pytest
import torch
import torch.distributed as dist


@pytest.mark.world(2)
def test_after_a_module_that_ends_ranks(world):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 2
