"""Equivalence: each parallelism's full state dicts equal the single-process ground truth.

Every rank trains on the same batch, so averaged gradients equal the
single-process gradients: the comparison is exact (bit for bit), before and
after training.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)

from conformance._compare import assert_state_dict_equal
from conformance._models import ground_truth, seeded_mlp, train

FULL = StateDictOptions(full_state_dict=True)


def wrap_ddp(model: nn.Module, world: Any) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model)


def wrap_fsdp1(model: nn.Module, world: Any) -> nn.Module:
    from torch.distributed.fsdp import FullyShardedDataParallel

    return FullyShardedDataParallel(model, device_id=world.device, use_orig_params=True)


def wrap_fsdp2(model: nn.Module, world: Any) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    mesh = world.mesh(world.size, ("dp",))
    for layer in (model.fc1, model.fc2):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


PARALLELISMS: dict[str, Callable[[nn.Module, Any], nn.Module]] = {
    "ddp": wrap_ddp,
    "fsdp1": wrap_fsdp1,
    "fsdp2": wrap_fsdp2,
}


@pytest.mark.world(1, 2, 4)
@pytest.mark.parametrize("parallelism", sorted(PARALLELISMS))
@pytest.mark.parametrize("steps", [0, 2])
def test_full_model_state_dict_equals_single_process(world, parallelism, steps):
    model = PARALLELISMS[parallelism](seeded_mlp(), world)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    train(model, optimizer, steps)
    expected, _ = ground_truth(steps)
    assert_state_dict_equal(get_model_state_dict(model, options=FULL), expected)


@pytest.mark.world(1, 2, 4)
@pytest.mark.parametrize("parallelism", sorted(PARALLELISMS))
def test_full_optimizer_state_equals_single_process(world, parallelism):
    model = PARALLELISMS[parallelism](seeded_mlp(), world)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    train(model, optimizer, steps=2)
    _, expected_state = ground_truth(steps=2)
    actual = get_optimizer_state_dict(model, optimizer, options=FULL)
    assert_state_dict_equal(actual["state"], expected_state)
    assert [sorted(group["params"]) for group in actual["param_groups"]] == [sorted(expected_state)]
