"""A small suite for the gate's own tests: one test id of each outcome a report shows."""

import pytest
import torch

from conformance.compare import assert_state_dict_equal
from conformance.training import Resources, plot_path, plot_readings


@pytest.mark.world(1, 2)
def test_agreeing_state_dicts(world):
    assert_state_dict_equal({"fc1.weight": torch.ones(2)}, {"fc1.weight": torch.ones(2)})
    if world.rank == 0:  # a plot, as checks draw them, for the report to show
        reading = Resources(rss=2**20, shared=0, pinned=0, fds=9, threads=3, children=0)
        readings = [[reading.as_dict()] * 3] * world.size
        plot_readings(readings, reading, 1, "readings", plot_path(f"readings-w{world.size}"))


@pytest.mark.world(2)
@pytest.mark.parametrize("cell", ["ddp", "fsdp2"])
def test_rank_one_differs(world, cell):
    value = torch.tensor([1.0, 2.0 + world.rank])
    assert_state_dict_equal({"fc1.weight": value}, {"fc1.weight": torch.tensor([1.0, 2.0])})


@pytest.mark.world(1, 2, applies=lambda size, cell: size == 2 or cell == "ddp")
@pytest.mark.parametrize("cell", ["ddp", "hsdp2"])
def test_cell_that_exists_at_two_ranks_only_in_hsdp2(world, cell):
    assert world.size in (1, 2)


@pytest.mark.world(2)
def test_cell_missing_at_this_size(world):
    pytest.skip("this cell runs at world sizes (4,)")


@pytest.mark.world(2)
def test_known_divergence(world):
    assert world.rank == 5


@pytest.mark.world(2)
def test_fixed_in_this_build(world):
    assert world.size == 2


def test_plain_failure():
    assert {"a": 1} == {"a": 2}
