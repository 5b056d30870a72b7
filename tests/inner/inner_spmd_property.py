"""Property searches across ranks: rank 0 searches, every rank checks each example."""

import pytest
import torch.distributed as dist
from hypothesis import strategies as st

from conformance.training import spmd_property


@pytest.mark.world(2)
def test_a_failure_on_one_rank_fails_every_rank(world):
    def check(n: int) -> None:
        assert not (world.rank == 1 and n >= 3), f"rank 1 rejects {n}"

    spmd_property(world.device, st.integers(0, 100), check)


@pytest.mark.world(2)
def test_every_rank_checks_the_same_examples(world):
    seen: list[int] = []
    spmd_property(world.device, st.integers(0, 10**6), seen.append, examples=20)
    everyones: list[list[int] | None] = [None] * world.size
    dist.all_gather_object(everyones, seen)
    assert len(seen) >= 10
    assert all(theirs == seen for theirs in everyones)
