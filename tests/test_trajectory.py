"""Snapshots of training state compare bit for bit, whatever the values."""

from __future__ import annotations

import torch

from conformance.training import differences


def _one(value: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"model.weight": value}


def test_a_nan_left_as_it_was_is_no_difference() -> None:
    nan = torch.tensor([1.0, float("nan"), 3.0])
    assert differences(_one(nan), _one(nan.clone()), ("after", "before")) == []


def test_the_sign_of_zero_is_a_difference() -> None:
    found = differences(_one(torch.tensor([-0.0])), _one(torch.tensor([0.0])), ("after", "before"))
    assert len(found) == 1
    assert found[0].startswith("model.weight: ")


def test_a_changed_value_is_named_with_both_sides() -> None:
    found = differences(_one(torch.tensor(2.0)), _one(torch.tensor(1.0)), ("after", "before"))
    assert len(found) == 1
    assert "after" in found[0]
    assert "before" in found[0]


def test_another_dtype_with_equal_values_is_a_difference() -> None:
    found = differences(
        _one(torch.ones(2, dtype=torch.float64)), _one(torch.ones(2)), ("after", "before")
    )
    assert len(found) == 1
