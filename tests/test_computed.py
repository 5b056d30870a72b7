"""Computed values held to a record: bit for bit on the same machine, within the dtype's
tolerance of the steps on another, every non-tensor value exactly."""

from __future__ import annotations

import torch

from conformance.compare import ULPS_PER_STEP, computed_differences, tolerance

RECORDED = torch.tensor([0.5, -0.25, 2.0, 1e-6])
LARGEST = 2.0


def _off_by(fraction_of_tolerance: float, steps: int) -> torch.Tensor:
    """``RECORDED`` with its first value moved by that fraction of the tolerance."""
    moved = RECORDED.clone()
    moved[0] += fraction_of_tolerance * tolerance(torch.float32, steps) * LARGEST
    return moved


def test_the_tolerance_is_the_steps_times_the_ulps_of_the_dtype():
    assert tolerance(torch.float32, 2) == 2 * ULPS_PER_STEP * torch.finfo(torch.float32).eps
    assert tolerance(torch.bfloat16, 1) == ULPS_PER_STEP * 2**-7


def test_differences_within_the_tolerance_of_the_steps_pass():
    assert computed_differences({"w": _off_by(0.9, steps=2)}, {"w": RECORDED}, steps=2) == []


def test_differences_beyond_it_are_named_with_both_values_and_the_allowance():
    found = computed_differences({"w": _off_by(1.5, steps=1)}, {"w": RECORDED}, steps=1)
    assert len(found) == 1
    assert found[0].startswith("w: computed torch.float32 [4] starting [0.5")
    assert "apart, more than" in found[0]
    assert f"1 step(s) x {ULPS_PER_STEP} x the precision of torch.float32" in found[0]
    assert "largest recorded magnitude 2" in found[0]


def test_no_steps_means_bit_for_bit():
    one_ulp = RECORDED.clone()
    one_ulp[3] = torch.nextafter(one_ulp[3], torch.tensor(1.0))
    assert computed_differences({"w": one_ulp}, {"w": RECORDED}, steps=0) != []
    assert computed_differences({"w": one_ulp}, {"w": RECORDED}, steps=1) == []
    signed_zero = torch.tensor([-0.0])
    assert computed_differences({"z": signed_zero}, {"z": torch.tensor([0.0])}, steps=0) != []
    assert computed_differences({"w": RECORDED.clone()}, {"w": RECORDED}, steps=0) == []


def test_dtype_shape_and_integer_tensors_are_held_exactly():
    as_double = RECORDED.double()
    assert computed_differences({"w": as_double}, {"w": RECORDED}, steps=4) != []
    assert computed_differences({"w": RECORDED[:3]}, {"w": RECORDED}, steps=4) != []
    counts = torch.tensor([3, 4])
    assert computed_differences({"n": counts + 1}, {"n": counts}, steps=4) != []


def test_nan_and_infinity_must_stand_where_the_record_has_them():
    recorded = torch.tensor([1.0, float("nan"), float("inf")])
    assert computed_differences({"w": recorded.clone()}, {"w": recorded}, steps=1) == []
    moved_nan = torch.tensor([float("nan"), 1.0, float("inf")])
    assert computed_differences({"w": moved_nan}, {"w": recorded}, steps=1) != []
    zero_for_nan = torch.tensor([1.0, 0.0, float("inf")])
    assert computed_differences({"w": zero_for_nan}, {"w": recorded}, steps=1) != []
    other_infinity = torch.tensor([1.0, float("nan"), float("-inf")])
    assert computed_differences({"w": other_infinity}, {"w": recorded}, steps=1) != []


def test_other_values_and_keys_are_held_exactly():
    recorded = {"lr": 0.005, "w": RECORDED}
    assert computed_differences({"lr": 0.0050001, "w": RECORDED}, recorded, steps=8) == [
        "lr: computed 0.0050001, recorded 0.005"
    ]
    assert computed_differences({"w": RECORDED}, recorded, steps=1) == [
        "lr: absent, recorded 0.005"
    ]
    assert computed_differences({**recorded, "extra": 1}, recorded, steps=1) == [
        "extra: computed 1, not in the record"
    ]
    step = {"step": torch.tensor(3.0)}
    assert computed_differences(step, {"step": 3.0}, steps=1) == [
        "step: computed torch.float32 [] starting [3.0], recorded 3.0"
    ]
