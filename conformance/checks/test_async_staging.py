"""Staging copies like the oracle, into memory of its own, and a kept stager into its buffers.

Judged against the oracle of ``_state_dict_utils``, whose contract staging is built on, and
against the live state. Every staging choice with a stager to call stages a cell's state as
``async_save`` hands it over. That state is ``get_state_dict``'s model and optimizer state, and
the scheduler's. The choices:

- ``BlockingAsyncStager``, cached or not;
- a ``FileSystemWriter``'s own staging, cached or not;
- ``DefaultStager`` with each ``StagingOptions`` flag on alone, all off, and all on;
- the ``DefaultStager`` a caller keeps, in shared memory, pinned memory or neither.

The staged copy must equal the oracle's staging of the same state in structure, types,
placements, devices, dtypes and values. The oracle stages with
``reference_impl.create_cpu_state_dict``, in pinned or shared memory as the choice says, and
fills the copy with ``reference_impl.copy_state_dict``. The staged copy must share no memory
with the live state. It must lie in shared memory where the choice says so: that is what a
process checkpointer receives without a copy. It must lie in pinned memory where the choice
says so (``Staging.pins``). The exceptions are the tensors each stager documents it leaves
unpinned: a 0-dim one in ``_create_cpu_state_dict``, and a storage under 5 bytes in
``DefaultStager``. On an H200 with torch 2.11, both staged AdamW's 0-dim ``step`` unpinned.

A stager kept across saves stages again after a training step. It must land in the very
buffers of its first staging, now holding the new values. The checks run on the cells that
stage each kind of tensor, at their smallest world size above one and at 4.

Each ``DefaultStager`` choice also stages, on one rank's device, what a state may hold beside
a training state:

- views of one tensor: a flattening, a view of it, a reshape to the same shape, a row, a
  column slice, a narrowing a dataclass holds;
- tensors carrying Python attributes (one with views, one nested);
- dataclasses (nested, and frozen) holding tensors, strings and lists;
- tensors of float64, int32, int64 and bool;
- empty tensors of one, two and three dims, and a 0-dim one.

The copy must equal the state, on the CPU, in shared or pinned memory only where the choice
asks. Its views must be views of one staged storage, at their offsets, so that a write to the
staged base shows in each. Its tensors keep their attributes, its dataclasses are of their
classes, and nothing of it changes when the state does. A kept stager then stages the
changed state into the same buffers, views and attributes kept as the first time.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

import reference_impl
from conformance.cells import PARALLELISMS, with_role
from conformance.compare import assert_trees_identical, local_tensors_by_path, memory_shared_with
from conformance.models.common import train
from conformance.training import (
    STAGINGS,
    Stagers,
    Staging,
    Training,
    Unheld,
    trained,
    training_state,
)

RECIPE = "adamw_step_lr"
WITH_A_STAGER = [name for name in STAGINGS if name != "default"]
DEFAULT_STAGERS = [name for name in STAGINGS if STAGINGS[name].options]


@dataclass
class _Inner:
    weights: torch.Tensor
    names: list[str]


@dataclass
class _Outer:
    inner: _Inner
    scale: torch.Tensor
    label: str = "outer"
    steps: list[int] = field(default_factory=lambda: [1, 2, 3])


@dataclass(frozen=True)
class _Frozen:
    tensor: torch.Tensor
    name: str


def _oracle_staging(state: dict[str, Any], pinned: bool, shared: bool) -> Any:
    copy = reference_impl.create_cpu_state_dict(state, pin_memory=pinned, share_memory=shared)
    return reference_impl.copy_state_dict(state, copy)


def _assert_memory_kinds(staged: Any, choice: Staging) -> None:
    """Shared and pinned memory where the choice asks for it, and only there."""
    for path, tensor in local_tensors_by_path(staged):
        if tensor.numel() == 0:
            continue
        assert tensor.is_shared() == choice.shared, (
            f"{path}: staged {'outside' if choice.shared else 'in'} shared memory"
        )
        if choice.pins(tensor):
            assert tensor.is_pinned(), f"{path}: staged outside pinned memory"
        elif not choice.pinned:
            assert not tensor.is_pinned(), f"{path}: staged in pinned memory, not asked for"


def _staged(stagers: Stagers, training: Training, world: Any, name: str) -> tuple[Any, Any]:
    """The live state of ``training`` and its staged copy."""
    state = training_state(*training)
    return state, stagers.stage(state, world.tmp_path / name)


@pytest.mark.world(4)
@pytest.mark.parametrize("staging", WITH_A_STAGER)
@pytest.mark.parametrize("cell", with_role("staging"))
def test_staging_copies_like_the_oracle_into_memory_of_its_own(world, cell, staging):
    choice = STAGINGS[staging]
    choice.skip_unless_available()
    model, optimizer, scheduler = training = trained(PARALLELISMS[cell], world, RECIPE, 2)
    stagers = Stagers(choice, Unheld())
    try:
        state, staged = _staged(stagers, training, world, "first")
        assert_trees_identical(staged, _oracle_staging(state, choice.pinned, choice.shared))
        shared = memory_shared_with(staged, state)
        assert not shared, f"staged tensors share memory with the live state: {shared}"
        _assert_memory_kinds(staged, choice)
        if not choice.cached:
            return
        buffers = {path: tensor.data_ptr() for path, tensor in local_tensors_by_path(staged)}
        train(model, optimizer, 1, scheduler, start=2)
        state, again = _staged(stagers, training, world, "second")
        assert_trees_identical(again, _oracle_staging(state, choice.pinned, choice.shared))
        moved = [
            path
            for path, tensor in local_tensors_by_path(again)
            if buffers.get(path) != tensor.data_ptr()
        ]
        assert not moved, f"the kept stager staged into new memory at {moved}"
    finally:
        stagers.close()


def _beside_a_training_state(device: torch.device) -> dict[str, Any]:
    """Views of one tensor, tensors carrying attributes (one of them viewed, one nested) and
    dataclasses, on ``device``."""
    base = torch.arange(100.0, device=device).reshape(10, 10)
    base.a = 42  # type: ignore[attr-defined]
    flat = base.view(100)
    nested = torch.linspace(0, 1, 5, device=device)
    nested.note = "kept"  # type: ignore[attr-defined]
    return {
        "base": base,
        "flat": flat,
        "flat_part": flat[10:60],
        "same_shape": base.view(10, 10),
        "row": base[1],
        "columns": base[:, 1:3],
        "deeper": {"tagged": nested},
        "nested": _Outer(_Inner(torch.ones(2, 2, device=device), ["a", "b"]), torch.tensor([0.5])),
        "frozen": _Frozen(torch.full((3,), 2.0, device=device), "frozen"),
        "narrowed": _Frozen(base.narrow(0, 2, 2), "narrowed"),
        "dtypes": {
            "float64": torch.linspace(-1, 1, 4, dtype=torch.float64, device=device),
            "int32": torch.arange(-2, 3, dtype=torch.int32, device=device),
            "int64": torch.tensor([2**40, -(2**40)], dtype=torch.int64, device=device),
            "bool": torch.tensor([True, False, True], device=device),
        },
        "empty": {
            "flat": torch.empty(0, device=device),
            "square": torch.empty(0, 0, device=device),
            "cube": torch.empty(0, 0, 0, device=device),
            "scalar": torch.tensor(3.5, device=device),
        },
    }


VIEWS = ("flat", "flat_part", "same_shape", "row", "columns", "narrowed")


def _view(staged: dict[str, Any], name: str) -> torch.Tensor:
    """The tensor viewed under ``name``, also where a dataclass holds it."""
    value = staged[name]
    return value.tensor if isinstance(value, _Frozen) else value


@pytest.mark.world(1)
@pytest.mark.parametrize("staging", DEFAULT_STAGERS)
def test_staging_keeps_views_attributes_and_dataclasses(world, staging):
    """A kept stager stages a second time, after the state changed, into the same buffers,
    as the first time."""
    choice = STAGINGS[staging]
    choice.skip_unless_available()
    state = _beside_a_training_state(world.device)
    stager = choice.make_stager()
    try:
        staged = _staged_by(stager, state)
        _assert_staged_as(staged, state, _beside_a_training_state(torch.device("cpu")), choice)
        _changed(state)
        assert_trees_identical(staged, _beside_a_training_state(torch.device("cpu")))
        staged["base"].fill_(7.0)
        for name in VIEWS:
            assert bool((_view(staged, name) == 7.0).all()), (
                f"{staging}: a write to the staged base is not seen in {name}"
            )
        if choice.cached:
            again = _staged_by(stager, state)
            expected = _changed(_beside_a_training_state(torch.device("cpu")))
            _assert_staged_as(again, state, expected, choice)
            storages = (again["base"].untyped_storage(), staged["base"].untyped_storage())
            assert storages[0].data_ptr() == storages[1].data_ptr(), (
                f"{staging}: the kept stager staged the second time into new memory"
            )
    finally:
        stager.close()


def _staged_by(stager: Any, state: dict[str, Any]) -> dict[str, Any]:
    staged = stager.stage(state)
    return staged.result() if isinstance(staged, Future) else staged


def _changed(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` after training changed its tensors in place (the frozen one too)."""
    changed = (state["base"], state["deeper"]["tagged"], state["nested"].inner.weights)
    for tensor in (*changed, state["frozen"].tensor):
        tensor.add_(100)
    return state


def _assert_staged_as(
    staged: dict[str, Any], state: dict[str, Any], expected: dict[str, Any], choice: Any
) -> None:
    """``staged`` holds ``expected``'s values in the memory ``choice`` promises, its views
    views of its base at the state's offsets, its tensors' attributes kept."""
    assert_trees_identical(staged, expected)
    _assert_memory_kinds(staged, choice)
    base = staged["base"]
    for name in VIEWS:
        view, live = _view(staged, name), _view(state, name)
        assert view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr(), (
            f"{choice.name}: the staged {name} is not a view of the staged base"
        )
        assert view.storage_offset() == live.storage_offset(), (
            f"{choice.name}: the staged {name} starts at {view.storage_offset()}, "
            f"the state's at {live.storage_offset()}"
        )
    attributes = (base.a, staged["deeper"]["tagged"].note)
    assert attributes == (42, "kept"), (
        f"{choice.name}: the staged tensors' attributes: {attributes}"
    )
