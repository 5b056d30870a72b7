"""Mixed precision: a state dict holds the fp32 masters, and a resumed run computes as one
process in the same precision.

FSDP1's ``MixedPrecision`` and FSDP2's ``MixedPrecisionPolicy`` compute in bf16 and keep the
sharded parameters in fp32; gradients are reduced in fp32 or in bf16 (``PRECISIONS``). The
cells in the ``precision`` role (``Parallelism.in_precision``) train the MLP with Adam at
their first size and at 4: FSDP1 under each sharding strategy (original parameters wrapped
whole, flat ones wrapped per unit), FSDP2 resharding after forward or not, and HSDP:

- each cell's sharded and full state dicts hold its parameters and optimizer state in fp32,
  and its buffers too (a test of their own); its full state equals one process that
  computes as the policy does (``conformance.models.mixed_precision``), bit for bit, a
  buffer given back in a low dtype compared by its values;
- saved through DCP after ``SAVED_AFTER`` steps and loaded into fresh objects of the same
  policy, the cell trains ``MORE_STEPS`` more to that process's state after all of them. The
  optimizer state is saved flattened: a nested one meets
  ``load-planner-drops-sharded-tensors-without-local-shards`` on FSDP1 at 4 ranks, which the
  DCP checks judge.

FSDP1 keeps its buffers in ``buffer_dtype`` from the first forward on, as documented: its
state dicts give them back as fp32 holding bf16 values. A buffer's full precision is lost
under FSDP1's mixed precision; FSDP2 does not cast buffers.

A dtype that must come back is a value a load may not change; ``test_dtype_loads.py`` judges
loads into templates of another dtype.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from conformance._upstream import dsd, full_options
from conformance.cells import (
    PARALLELISMS,
    PRECISIONS,
    Parallelism,
    first_size_and_four,
    with_role,
)
from conformance.models.common import seeded_mlp, train
from conformance.models.mixed_precision import mixed_precision_truth
from conformance.models.optimizers import adam
from conformance.models.zoo import model_of
from conformance.training import assert_state_is, load_checkpoint, save_checkpoint, tree_leaves

CELLS = with_role("precision")
SAVED_AFTER = 2
MORE_STEPS = 1


def _cell(name: str, precision: str, world: Any) -> Parallelism:
    cell = PARALLELISMS[name]
    cell.skip_unless_runnable(world.device)
    return cell.in_precision(PRECISIONS[precision])


def _trained(cell: Parallelism, world: Any, steps: int, start: int = 0) -> tuple[Any, Any]:
    model = model_of(cell, world)
    optimizer = adam(model)
    train(model, optimizer, steps, start=start)
    return model, optimizer


def _narrower_than_fp32(state: Any, buffers: bool) -> dict[str, torch.dtype]:
    """The floating values of a ``(model, optimizer)`` state held narrower than fp32: the
    buffers' (``buffers``) or every other value's."""
    buffer_paths = {f"[0].{name}" for name, _ in seeded_mlp().named_buffers()}
    return {
        path: value.dtype
        for path, value in tree_leaves(state).items()
        if isinstance(value, torch.Tensor)
        and value.is_floating_point()
        and value.dtype != torch.float32
        and (path in buffer_paths) == buffers
    }


def _narrow_values(model: Any, optimizer: Any, buffers: bool) -> dict[str, Any]:
    return {
        kind: _narrower_than_fp32(dsd.get_state_dict(model, optimizer, options=options), buffers)
        for kind, options in (("sharded", None), ("full", full_options()))
    }


def _assert_is_the_truth(model: Any, optimizer: Any, name: str, precision: str, steps: int):
    """The full state equals the policy's one process, bit for bit; a buffer given back in a
    low dtype is compared by its values (``test_..._gives_its_buffers_back_in_fp32`` judges
    its dtype): FSDP1's buffers hold the low dtype's values in any case."""
    truth = mixed_precision_truth(
        steps, PRECISIONS[precision], "fsdp2" if PARALLELISMS[name].fsdp2 else "fsdp1", "cpu"
    )
    model_state, optim_state = dsd.get_state_dict(model, optimizer, options=full_options())
    in_fp32 = {
        key: value.float()
        if key in truth.model and value.dtype != truth.model[key].dtype
        else value
        for key, value in model_state.items()
    }
    assert_state_is(in_fp32, optim_state, truth, full_load=True)


@pytest.mark.world(2, 4, applies=first_size_and_four("name"))
@pytest.mark.parametrize("precision", sorted(PRECISIONS))
@pytest.mark.parametrize("name", CELLS)
def test_a_mixed_precision_state_dict_holds_the_fp32_masters(world, name, precision):
    model, optimizer = _trained(_cell(name, precision, world), world, SAVED_AFTER)
    low = _narrow_values(model, optimizer, buffers=False)
    assert not any(low.values()), f"rank {world.rank}: the state dicts hold {low}"
    _assert_is_the_truth(model, optimizer, name, precision, SAVED_AFTER)


@pytest.mark.world(2, 4, applies=first_size_and_four("name"))
@pytest.mark.parametrize("precision", sorted(PRECISIONS))
@pytest.mark.parametrize("name", CELLS)
def test_a_mixed_precision_state_dict_gives_its_buffers_back_in_fp32(world, name, precision):
    model, optimizer = _trained(_cell(name, precision, world), world, SAVED_AFTER)
    low = _narrow_values(model, optimizer, buffers=True)
    assert not any(low.values()), f"rank {world.rank}: the state dicts hold buffers {low}"


@pytest.mark.world(2, 4, applies=first_size_and_four("name"))
@pytest.mark.parametrize("precision", sorted(PRECISIONS))
@pytest.mark.parametrize("name", CELLS)
def test_a_mixed_precision_run_resumes_as_one_process(world, name, precision):
    cell = _cell(name, precision, world)
    model, optimizer = _trained(cell, world, SAVED_AFTER)
    path = str(world.tmp_path / "checkpoint")
    save_checkpoint(model, optimizer, path, flatten=True)
    model, optimizer = _trained(cell, world, 0)
    load_checkpoint(model, optimizer, path, flatten=True)
    train(model, optimizer, MORE_STEPS, start=SAVED_AFTER)
    _assert_is_the_truth(model, optimizer, name, precision, SAVED_AFTER + MORE_STEPS)
