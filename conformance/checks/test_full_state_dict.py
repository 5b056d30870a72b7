"""Equivalence: each parallelism's full state dicts equal the single-process ground truth.

Every rank trains on the same batch, so averaged gradients equal the
single-process ones and data parallelism is exact, bit for bit, before and
after training. Tensor parallelism splits each matrix product and sums the
partial products in another order. Float32 results then differ in the last
bits (about 1e-7 relative), and two optimizer steps carry that forward. So
TP cells compare within rtol 1e-5 and atol 1e-7. Measured differences stay
below 1.5e-8 absolute, 1e-6 relative.
"""

from __future__ import annotations

from typing import Any

import pytest

from conformance._upstream import dsd, full_options
from conformance.cells import PARALLELISMS, comparison_tolerance, exists_at_size
from conformance.compare import assert_state_dict_equal
from conformance.models.common import train
from conformance.models.optimizers import OPTIMIZERS
from conformance.models.zoo import model_of, truth_of


def _cells() -> list[tuple[str, str]]:
    """Each parallelism with each optimizer; no per-layer groups where parameters span layers."""
    return [
        (name, recipe)
        for name, cell in sorted(PARALLELISMS.items())
        for recipe in sorted(OPTIMIZERS)
        if OPTIMIZERS[recipe].applies_to(cell)
    ]


@pytest.mark.world(1, 2, 4, 8, applies=exists_at_size())
@pytest.mark.parametrize(("name", "recipe"), _cells())
@pytest.mark.parametrize("steps", [0, 2])
def test_full_state_dicts_equal_single_process(world, name, recipe, steps):
    parallelism = PARALLELISMS[name]
    model = model_of(parallelism, world)
    optimizer, scheduler = OPTIMIZERS[recipe].build(model)
    train(model, optimizer, steps, scheduler)
    expected = truth_of(parallelism, steps, OPTIMIZERS[recipe], world.device).held_by(model)
    tolerance = comparison_tolerance(parallelism)
    assert_state_dict_equal(
        dsd.get_model_state_dict(model, options=full_options()), expected.model, **tolerance
    )
    actual = dsd.get_optimizer_state_dict(model, optimizer, options=full_options())
    if steps:  # before any step, DSD creates the state itself
        assert_state_dict_equal(actual["state"], expected.optimizer_state, **tolerance)
    assert _groups_by_params(actual["param_groups"]) == _groups_by_params(expected.param_groups)


def _groups_by_params(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Param groups with sorted FQN lists: the order within a group is no part of the contract."""
    return [{**group, "params": sorted(group["params"])} for group in groups]
